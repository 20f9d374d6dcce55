/*
 * nccl-net-rail: NCCL's configuration files, applied the way NCCL applies
 * them, so that rail-info sees the variables a job would see.
 *
 * NCCL reads, once, before it reads any variable: the file NCCL_CONF_FILE
 * names when that is set and not empty, otherwise ~/.nccl.conf (the home
 * directory of the user from the password database), then /etc/nccl.conf.
 * Each line VAR=value is put into the environment only when VAR is not set
 * yet, so the environment wins over the files and the first file over the
 * second. Lines starting with '#' and lines without '=' are skipped; nothing
 * is trimmed (a space before '=' becomes part of the name).
 */
#ifndef RAIL_NCCLCONF_H
#define RAIL_NCCLCONF_H

#include <limits.h>

#define RAIL_NCCLCONF_MAX_FILES 2
/* NCCL copies names and values into 1024-byte buffers. */
#define RAIL_NCCLCONF_MAX_LEN 1023

enum rail_ncclconf_state {
	RAIL_NCCLCONF_APPLIED,	 /* this line set the variable */
	RAIL_NCCLCONF_ENV_WINS,	 /* already in the environment: the line is ignored */
	RAIL_NCCLCONF_SHADOWED,	 /* an earlier line or file set it first */
	RAIL_NCCLCONF_REJECTED,	 /* setenv refused the name (e.g. empty) */
};

struct rail_ncclconf_var {
	char *name;
	char *value;
	int line;
	enum rail_ncclconf_state state;
	/* Whitespace or a carriage return that NCCL keeps in the name or value. */
	int odd_space;
};

struct rail_ncclconf_file {
	char path[PATH_MAX];
	int err;		/* 0: read; -ENOENT: absent; else why it was not read */
	int nvars;
	struct rail_ncclconf_var *vars;
};

struct rail_ncclconf {
	int nfiles;
	struct rail_ncclconf_file files[RAIL_NCCLCONF_MAX_FILES];
};

/*
 * NCCL's list of files for this process: fills paths (up to
 * RAIL_NCCLCONF_MAX_FILES) and returns how many.
 */
int rail_ncclconf_default_paths(char paths[][PATH_MAX], int max);

/*
 * Apply the files in order (setenv without overwrite, as NCCL does) and
 * record in *out, for each file, whether it was read and what each line
 * did. Returns 0, or -ENOMEM (what was applied stays applied). Free *out
 * with rail_ncclconf_free.
 */
int rail_ncclconf_apply(const char *const *paths, int npaths, struct rail_ncclconf *out);

/* Where the variable's value came from: the file that set it, or NULL. */
const char *rail_ncclconf_source(const struct rail_ncclconf *c, const char *name);

const char *rail_ncclconf_state_name(enum rail_ncclconf_state s);

void rail_ncclconf_free(struct rail_ncclconf *c);

#endif

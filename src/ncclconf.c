/*
 * nccl-net-rail: NCCL's configuration files (ncclconf.h).
 *
 * How NCCL does it, checked in NVIDIA/nccl src/misc/param.cc: initEnvFunc()
 * (run once through initEnv() by ncclGetEnv(), so before any variable is
 * read) takes the file named by NCCL_CONF_FILE when that is set and not
 * empty, else "<home>/.nccl.conf" with the home directory from
 * getpwuid(getuid()), and then always "/etc/nccl.conf". setEnvFile() reads
 * a file line by line with getline, skips a line whose first character is
 * '#', drops the final newline, skips a line with no '=', cuts the name at
 * the first '=' and hands both parts to ncclOsSetEnv(), which on Linux is
 * setenv(name, value, 0): never overwrite. Hence the environment wins over
 * both files and the first file over the second. This file is our own
 * implementation of those rules.
 */
#include <errno.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ncclconf.h"
#include "rail.h"

int rail_ncclconf_default_paths(char paths[][PATH_MAX], int max)
{
	/* Read directly: it selects the files, so it cannot come from them. */
	const char *user = getenv("NCCL_CONF_FILE");
	int n = 0;

	if (max < 2)
		return -EINVAL;
	if (user && user[0]) {
		snprintf(paths[n++], PATH_MAX, "%s", user);
	} else {
		struct passwd *pw = getpwuid(getuid());

		if (pw && pw->pw_dir)
			snprintf(paths[n++], PATH_MAX, "%s/.nccl.conf", pw->pw_dir);
	}
	snprintf(paths[n++], PATH_MAX, "/etc/nccl.conf");
	return n;
}

const char *rail_ncclconf_state_name(enum rail_ncclconf_state s)
{
	switch (s) {
	case RAIL_NCCLCONF_APPLIED: return "applied";
	case RAIL_NCCLCONF_ENV_WINS: return "environment_wins";
	case RAIL_NCCLCONF_SHADOWED: return "earlier_line_wins";
	case RAIL_NCCLCONF_REJECTED: return "rejected";
	}
	return "unknown";
}

const char *rail_ncclconf_source(const struct rail_ncclconf *c, const char *name)
{
	for (int f = 0; c && f < c->nfiles; f++)
		for (int i = 0; i < c->files[f].nvars; i++) {
			const struct rail_ncclconf_var *v = &c->files[f].vars[i];

			if (v->state == RAIL_NCCLCONF_APPLIED && !strcmp(v->name, name))
				return c->files[f].path;
		}
	return NULL;
}

static int has_odd_space(const char *name, const char *value)
{
	size_t vl = strlen(value);

	if (strpbrk(name, " \t\r"))
		return 1;
	return vl && (strchr(" \t", value[0]) || strchr(" \t\r", value[vl - 1]));
}

static char *dup_max(const char *s, size_t len)
{
	return strndup(s, RAIL_MIN(len, (size_t)RAIL_NCCLCONF_MAX_LEN));
}

/* One "NAME=value" line (newline removed): record it, then apply it. */
static int apply_line(struct rail_ncclconf *c, struct rail_ncclconf_file *f, const char *line,
		      int lineno)
{
	const char *eq = strchr(line, '=');
	struct rail_ncclconf_var *v, *grown;

	grown = realloc(f->vars, (size_t)(f->nvars + 1) * sizeof(*f->vars));
	if (!grown)
		return -ENOMEM;
	f->vars = grown;
	v = &f->vars[f->nvars];
	memset(v, 0, sizeof(*v));
	v->name = dup_max(line, (size_t)(eq - line));
	v->value = dup_max(eq + 1, strlen(eq + 1));
	if (!v->name || !v->value) {
		free(v->name);
		free(v->value);
		return -ENOMEM;
	}
	f->nvars++;
	v->state = RAIL_NCCLCONF_REJECTED; /* not APPLIED while looking for earlier lines */
	v->line = lineno;
	v->odd_space = has_odd_space(v->name, v->value);
	if (v->name[0] && getenv(v->name))
		v->state = rail_ncclconf_source(c, v->name) ? RAIL_NCCLCONF_SHADOWED
							    : RAIL_NCCLCONF_ENV_WINS;
	else if (setenv(v->name, v->value, 0))
		v->state = RAIL_NCCLCONF_REJECTED;
	else
		v->state = RAIL_NCCLCONF_APPLIED;
	return 0;
}

static int apply_file(struct rail_ncclconf *c, struct rail_ncclconf_file *f)
{
	FILE *in = fopen(f->path, "r");
	char *line = NULL;
	size_t cap = 0;
	ssize_t len;
	int lineno = 0, err = 0;

	if (!in) {
		f->err = -errno;
		return 0;
	}
	while (!err && (len = getline(&line, &cap, in)) != -1) {
		lineno++;
		if (line[0] == '#')
			continue;
		if (len > 0 && line[len - 1] == '\n')
			line[len - 1] = '\0';
		if (!strchr(line, '='))
			continue;
		err = apply_line(c, f, line, lineno);
	}
	if (!err && ferror(in))
		f->err = -EIO;
	free(line);
	fclose(in);
	return err;
}

int rail_ncclconf_apply(const char *const *paths, int npaths, struct rail_ncclconf *out)
{
	int err = 0;

	memset(out, 0, sizeof(*out));
	for (int i = 0; i < npaths && i < RAIL_NCCLCONF_MAX_FILES && !err; i++) {
		struct rail_ncclconf_file *f = &out->files[out->nfiles++];

		rail_strlcpy(f->path, paths[i], sizeof(f->path));
		err = apply_file(out, f);
	}
	return err;
}

void rail_ncclconf_free(struct rail_ncclconf *c)
{
	for (int f = 0; f < c->nfiles; f++) {
		for (int i = 0; i < c->files[f].nvars; i++) {
			free(c->files[f].vars[i].name);
			free(c->files[f].vars[i].value);
		}
		free(c->files[f].vars);
	}
	memset(c, 0, sizeof(*c));
}

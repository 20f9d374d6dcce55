/*
 * nccl-net-rail: typed access to the one parameter table (params.def).
 */
#ifndef RAIL_PARAM_H
#define RAIL_PARAM_H

#include <stdint.h>
#include <stdio.h>

enum rail_param_id {
#define RAIL_PARAM(id, name, type, def, min, max, values, doc) RAIL_P_##id,
#include "params.def"
#undef RAIL_PARAM
	RAIL_P_COUNT
};

enum rail_param_type {
	RAIL_PT_INT,
	RAIL_PT_AUTOINT,
	RAIL_PT_BOOL,
	RAIL_PT_SIZE,
	RAIL_PT_ENUM,
	RAIL_PT_STR,
};

/* Value of AUTOINT and SIZE parameters left at "auto". */
#define RAIL_PARAM_AUTO (-1)

struct rail_param_desc {
	const char *name;
	enum rail_param_type type;
	const char *def;
	int64_t min, max;
	const char *values;
	const char *doc;
};

extern const struct rail_param_desc rail_param_table[RAIL_P_COUNT];

/*
 * Read every parameter from the environment (once; later calls are no-ops
 * until rail_params_reload). Logs "X set by environment to Y" at INFO for
 * each variable set, warns for bad values (keeping the default) and for
 * unknown NCCL_RAIL_* variables (naming the nearest known one).
 */
void rail_params_load(void);
void rail_params_reload(void);
/* Free the values (the plugin is about to be unloaded); the next use reloads. */
void rail_params_unload(void);

int64_t rail_param_int(enum rail_param_id id);
const char *rail_param_str(enum rail_param_id id);
/* 1 if the value came from the environment, 0 if it is the default. */
int rail_param_is_set(enum rail_param_id id);
/* The value as text, as rail-info prints it. */
const char *rail_param_value_text(enum rail_param_id id, char *buf, size_t len);
const char *rail_param_type_name(enum rail_param_type type);

/*
 * Parse one value of the given parameter without storing it: 0 and *out on
 * success, -EINVAL with a reason in why otherwise. Exposed for unit tests.
 */
int rail_param_parse(enum rail_param_id id, const char *text, int64_t *out, char *why,
		     size_t why_len);

/* Levenshtein distance, used for "did you mean" hints. */
int rail_edit_distance(const char *a, const char *b);

/* Print the table: "text" (rail-info --config), "markdown" (README), "json". */
void rail_params_print(FILE *out, const char *format);

#endif

/* nccl-net-rail: the parameter parser, generated from params.def. */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "log.h"
#include "param.h"
#include "rail.h"

extern char **environ;

const struct rail_param_desc rail_param_table[RAIL_P_COUNT] = {
#define RAIL_PARAM(id, name, type, def, min, max, values, doc) \
	[RAIL_P_##id] = { name, RAIL_PT_##type, def, min, max, values, doc },
#include "params.def"
#undef RAIL_PARAM
};

struct rail_param_value {
	int64_t num;
	char *str;
	int from_env;
};

static struct rail_param_value rail_values[RAIL_P_COUNT];
static _Atomic int rail_params_loaded;
static pthread_mutex_t rail_params_lock = PTHREAD_MUTEX_INITIALIZER;

const char *rail_param_type_name(enum rail_param_type type)
{
	static const char *const names[] = { "int", "int|auto", "bool", "size", "enum", "string" };

	return names[type];
}

static int parse_int(const char *s, int64_t *out)
{
	char *end;
	long long v;

	errno = 0;
	v = strtoll(s, &end, 0);
	if (errno || end == s || *end != '\0')
		return -EINVAL;
	*out = v;
	return 0;
}

static int parse_size(const char *s, int64_t *out)
{
	char *end;
	unsigned long long v;
	uint64_t mult = 1;

	if (*s == '-')
		return -EINVAL;
	errno = 0;
	v = strtoull(s, &end, 0);
	if (errno || end == s)
		return -EINVAL;
	switch (tolower((unsigned char)*end)) {
	case '\0': break;
	case 'k': mult = 1ull << 10; end++; break;
	case 'm': mult = 1ull << 20; end++; break;
	case 'g': mult = 1ull << 30; end++; break;
	default: return -EINVAL;
	}
	if (*end == 'b' || *end == 'B')
		end++;
	if (*end != '\0' || v > (uint64_t)INT64_MAX / mult)
		return -EINVAL;
	*out = (int64_t)(v * mult);
	return 0;
}

static int parse_bool(const char *s, int64_t *out)
{
	static const char *const yes[] = { "1", "y", "yes", "true", "on" };
	static const char *const no[] = { "0", "n", "no", "false", "off" };

	for (size_t i = 0; i < RAIL_ARRAY_SIZE(yes); i++) {
		if (!strcasecmp(s, yes[i])) {
			*out = 1;
			return 0;
		}
		if (!strcasecmp(s, no[i])) {
			*out = 0;
			return 0;
		}
	}
	return -EINVAL;
}

static int parse_enum(const char *values, const char *s, int64_t *out)
{
	const char *p = values;
	size_t len = strlen(s);

	for (int64_t idx = 0; *p; idx++) {
		const char *bar = strchr(p, '|');
		size_t n = bar ? (size_t)(bar - p) : strlen(p);

		if (n == len && !strncasecmp(p, s, n)) {
			*out = idx;
			return 0;
		}
		if (!bar)
			break;
		p = bar + 1;
	}
	return -EINVAL;
}

int rail_param_parse(enum rail_param_id id, const char *text, int64_t *out, char *why,
		     size_t why_len)
{
	const struct rail_param_desc *d = &rail_param_table[id];
	int64_t v = 0;
	int err = 0;
	/* NCCL's -2 ("not set: the library decides") is its auto. */
	int is_auto = !strcasecmp(text, "auto") || !strcmp(text, "-2");

	switch (d->type) {
	case RAIL_PT_STR:
		*out = 0;
		return 0;
	case RAIL_PT_BOOL:
		err = parse_bool(text, &v);
		if (err)
			snprintf(why, why_len, "expected 0/1, yes/no, true/false or on/off");
		break;
	case RAIL_PT_ENUM:
		err = parse_enum(d->values, text, &v);
		if (err)
			snprintf(why, why_len, "expected one of %s", d->values);
		break;
	case RAIL_PT_AUTOINT:
	case RAIL_PT_SIZE:
		if (is_auto && (d->type == RAIL_PT_AUTOINT || !strcmp(d->def, "auto"))) {
			*out = RAIL_PARAM_AUTO;
			return 0;
		}
		/* fall through */
	case RAIL_PT_INT:
		err = d->type == RAIL_PT_SIZE ? parse_size(text, &v) : parse_int(text, &v);
		if (!err && (v < d->min || v > d->max))
			err = -ERANGE;
		if (err)
			snprintf(why, why_len, "expected %s%s in [%" PRId64 ", %" PRId64 "]",
				 d->type == RAIL_PT_SIZE ? "a size (k/m/g suffix allowed)"
							 : "an integer",
				 d->type == RAIL_PT_AUTOINT ? " or auto" : "", d->min, d->max);
		break;
	}
	if (err)
		return -EINVAL;
	*out = v;
	return 0;
}

static void set_value(enum rail_param_id id, const char *text, int from_env)
{
	struct rail_param_value *pv = &rail_values[id];
	int64_t v = 0;
	char why[160];

	if (rail_param_parse(id, text, &v, why, sizeof(why)) != 0) {
		/* Defaults are tested by the unit suite; this keeps them honest. */
		RAIL_WARN("internal: default %s=%s does not parse: %s", rail_param_table[id].name,
			  text, why);
		return;
	}
	free(pv->str);
	pv->str = strdup(text);
	pv->num = v;
	pv->from_env = from_env;
}

static void warn_unknown(const char *var)
{
	const char *best = NULL;
	int best_d = 1 << 30;
	size_t len = strcspn(var, "=");
	char name[128];

	rail_strlcpy(name, var, RAIL_MIN(len + 1, sizeof(name)));
	for (int i = 0; i < RAIL_P_COUNT; i++) {
		if (!strcmp(rail_param_table[i].name, name))
			return;
		int d = rail_edit_distance(name, rail_param_table[i].name);
		if (d < best_d) {
			best_d = d;
			best = rail_param_table[i].name;
		}
	}
	if (best && best_d <= (int)strlen(name) / 2)
		RAIL_WARN("unknown variable %s is ignored; did you mean %s?", name, best);
	else
		RAIL_WARN("unknown variable %s is ignored (rail-info --config lists them all)",
			  name);
}

static void load_locked(void)
{
	for (int i = 0; i < RAIL_P_COUNT; i++) {
		const struct rail_param_desc *d = &rail_param_table[i];
		const char *env = getenv(d->name);
		int64_t v;
		char why[160];

		set_value((enum rail_param_id)i, d->def, 0);
		if (!env)
			continue;
		if (rail_param_parse((enum rail_param_id)i, env, &v, why, sizeof(why)) != 0) {
			RAIL_WARN("%s=\"%s\" is not valid (%s); using the default %s", d->name, env,
				  why, d->def[0] ? d->def : "(empty)");
			continue;
		}
		set_value((enum rail_param_id)i, env, 1);
		RAIL_INFO(RAIL_LOG_ENV, "%s set by environment to %s", d->name, env);
	}
	for (char **e = environ; e && *e; e++) {
		if (!strncmp(*e, "NCCL_RAIL_", 10))
			warn_unknown(*e);
	}
	rail_params_loaded = 1;
}

void rail_params_load(void)
{
	pthread_mutex_lock(&rail_params_lock);
	if (!rail_params_loaded)
		load_locked();
	pthread_mutex_unlock(&rail_params_lock);
}

void rail_params_unload(void)
{
	pthread_mutex_lock(&rail_params_lock);
	for (int i = 0; i < RAIL_P_COUNT; i++) {
		free(rail_values[i].str);
		rail_values[i].str = NULL;
	}
	rail_params_loaded = 0;
	pthread_mutex_unlock(&rail_params_lock);
}

void rail_params_reload(void)
{
	pthread_mutex_lock(&rail_params_lock);
	load_locked();
	pthread_mutex_unlock(&rail_params_lock);
}

int64_t rail_param_int(enum rail_param_id id)
{
	if (!rail_params_loaded)
		rail_params_load();
	return rail_values[id].num;
}

const char *rail_param_str(enum rail_param_id id)
{
	if (!rail_params_loaded)
		rail_params_load();
	return rail_values[id].str ? rail_values[id].str : "";
}

int rail_param_is_set(enum rail_param_id id)
{
	if (!rail_params_loaded)
		rail_params_load();
	return rail_values[id].from_env;
}

const char *rail_param_value_text(enum rail_param_id id, char *buf, size_t len)
{
	rail_strlcpy(buf, rail_param_str(id), len);
	return buf;
}

int rail_edit_distance(const char *a, const char *b)
{
	size_t la = strlen(a), lb = strlen(b);
	int row[128];

	if (lb >= RAIL_ARRAY_SIZE(row))
		return 1 << 20;
	for (size_t j = 0; j <= lb; j++)
		row[j] = (int)j;
	for (size_t i = 1; i <= la; i++) {
		int diag = row[0];

		row[0] = (int)i;
		for (size_t j = 1; j <= lb; j++) {
			int up = row[j];
			int cost = toupper((unsigned char)a[i - 1]) != toupper((unsigned char)b[j - 1]);
			int best = RAIL_MIN(row[j] + 1, row[j - 1] + 1);

			row[j] = RAIL_MIN(best, diag + cost);
			diag = up;
		}
	}
	return row[lb];
}

static void json_string(FILE *out, const char *s)
{
	fputc('"', out);
	for (; *s; s++) {
		if (*s == '"' || *s == '\\')
			fprintf(out, "\\%c", *s);
		else if ((unsigned char)*s < 0x20)
			fprintf(out, "\\u%04x", *s);
		else
			fputc(*s, out);
	}
	fputc('"', out);
}

static void print_markdown(FILE *out)
{
	fprintf(out, "| Variable | Type | Default | Description |\n");
	fprintf(out, "|---|---|---|---|\n");
	for (int i = 0; i < RAIL_P_COUNT; i++) {
		const struct rail_param_desc *d = &rail_param_table[i];
		const char *type = d->type == RAIL_PT_ENUM ? d->values : rail_param_type_name(d->type);

		fprintf(out, "| `%s` | ", d->name);
		for (const char *p = type; *p; p++)
			fputs(*p == '|' ? "\\|" : (char[2]){ *p, 0 }, out);
		fprintf(out, " | `%s` | %s |\n", d->def[0] ? d->def : "\"\"", d->doc);
	}
}

void rail_params_print(FILE *out, const char *format)
{
	if (!strcmp(format, "markdown")) {
		print_markdown(out);
		return;
	}
	if (!strcmp(format, "json")) {
		fprintf(out, "[");
		for (int i = 0; i < RAIL_P_COUNT; i++) {
			const struct rail_param_desc *d = &rail_param_table[i];

			fprintf(out, "%s\n  {\"name\": \"%s\", \"type\": \"%s\", \"value\": ",
				i ? "," : "", d->name, rail_param_type_name(d->type));
			json_string(out, rail_param_str((enum rail_param_id)i));
			fprintf(out, ", \"default\": ");
			json_string(out, d->def);
			fprintf(out, ", \"set\": %s, \"doc\": ",
				rail_param_is_set((enum rail_param_id)i) ? "true" : "false");
			json_string(out, d->doc);
			fprintf(out, "}");
		}
		fprintf(out, "\n]\n");
		return;
	}
	for (int i = 0; i < RAIL_P_COUNT; i++) {
		const struct rail_param_desc *d = &rail_param_table[i];
		const char *v = rail_param_str((enum rail_param_id)i);

		fprintf(out, "  %-28s = %-10s %s(default %s)\n      %s\n", d->name,
			v[0] ? v : "\"\"", rail_param_is_set((enum rail_param_id)i) ? "[env] " : "",
			d->def[0] ? d->def : "\"\"", d->doc);
	}
}

/*
 * nccl-net-rail unit tests: a small strict JSON reader, enough to check that
 * rail-info prints valid JSON and to read test/fixtures/<name>/expected.json.
 * Not for production use: no \u escapes beyond ASCII, numbers as double.
 */
#ifndef RAIL_TEST_TOPO_JSON_H
#define RAIL_TEST_TOPO_JSON_H

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum tj_type { TJ_NULL, TJ_BOOL, TJ_NUM, TJ_STR, TJ_ARR, TJ_OBJ };

struct tj {
	enum tj_type type;
	double num;		/* TJ_NUM, TJ_BOOL */
	char *str;		/* TJ_STR */
	int n;			/* TJ_ARR, TJ_OBJ */
	struct tj *items;	/* values */
	char **keys;		/* TJ_OBJ */
};

struct tj_parser {
	const char *s;
	const char *err;
};

static inline void tj_ws(struct tj_parser *p)
{
	while (*p->s == ' ' || *p->s == '\t' || *p->s == '\n' || *p->s == '\r')
		p->s++;
}

static inline int tj_value(struct tj_parser *p, struct tj *v);
static inline void tj_free(struct tj *v);

static inline int tj_string(struct tj_parser *p, char **out)
{
	size_t cap = 16, n = 0;
	char *b = malloc(cap);

	if (!b || *p->s != '"')
		return (free(b), p->err = "string expected", -1);
	p->s++;
	while (*p->s != '"') {
		char c = *p->s++;

		if ((unsigned char)c < 0x20)
			return (free(b), p->err = "control character in string", -1);
		if (c == '\\') {
			c = *p->s++;
			switch (c) {
			case '"': case '\\': case '/': break;
			case 'n': c = '\n'; break;
			case 't': c = '\t'; break;
			case 'r': c = '\r'; break;
			case 'b': c = '\b'; break;
			case 'f': c = '\f'; break;
			case 'u':
				for (int i = 0; i < 4; i++)
					if (!isxdigit((unsigned char)p->s[i]))
						return (free(b), p->err = "bad \\u escape", -1);
				c = (char)strtol((char[5]){ p->s[0], p->s[1], p->s[2], p->s[3], 0 },
						 NULL, 16);
				p->s += 4;
				break;
			default:
				return (free(b), p->err = "bad escape", -1);
			}
		}
		if (n + 2 > cap) {
			char *nb = realloc(b, cap *= 2);

			if (!nb)
				return (free(b), -1);
			b = nb;
		}
		b[n++] = c;
	}
	p->s++;
	b[n] = '\0';
	*out = b;
	return 0;
}

static inline int tj_push(struct tj *v, struct tj *item, char *key)
{
	struct tj *ni = realloc(v->items, (size_t)(v->n + 1) * sizeof(*ni));

	if (!ni)
		return -1;
	v->items = ni;
	if (v->type == TJ_OBJ) {
		char **nk = realloc(v->keys, (size_t)(v->n + 1) * sizeof(*nk));

		if (!nk)
			return -1;
		v->keys = nk;
		v->keys[v->n] = key;
	}
	v->items[v->n++] = *item;
	return 0;
}

static inline int tj_container(struct tj_parser *p, struct tj *v, char close)
{
	p->s++;
	tj_ws(p);
	if (*p->s == close)
		return (p->s++, 0);
	for (;;) {
		struct tj item;
		char *key = NULL;

		tj_ws(p);
		if (close == '}') {
			if (tj_string(p, &key))
				return -1;
			tj_ws(p);
			if (*p->s++ != ':')
				return (free(key), p->err = "':' expected", -1);
		}
		if (tj_value(p, &item) || tj_push(v, &item, key)) {
			tj_free(&item);
			free(key);
			return -1;
		}
		tj_ws(p);
		if (*p->s == ',') {
			p->s++;
			continue;
		}
		if (*p->s++ == close)
			return 0;
		p->err = close == '}' ? "',' or '}' expected" : "',' or ']' expected";
		return -1;
	}
}

static inline int tj_value(struct tj_parser *p, struct tj *v)
{
	memset(v, 0, sizeof(*v));
	tj_ws(p);
	if (*p->s == '{') {
		v->type = TJ_OBJ;
		return tj_container(p, v, '}');
	}
	if (*p->s == '[') {
		v->type = TJ_ARR;
		return tj_container(p, v, ']');
	}
	if (*p->s == '"') {
		v->type = TJ_STR;
		return tj_string(p, &v->str);
	}
	if (!strncmp(p->s, "true", 4) || !strncmp(p->s, "null", 4)) {
		v->type = p->s[0] == 't' ? TJ_BOOL : TJ_NULL;
		v->num = p->s[0] == 't';
		p->s += 4;
		return 0;
	}
	if (!strncmp(p->s, "false", 5)) {
		v->type = TJ_BOOL;
		p->s += 5;
		return 0;
	}
	if (*p->s == '-' || isdigit((unsigned char)*p->s)) {
		char *end;

		if (p->s[0] == '0' && isdigit((unsigned char)p->s[1]))
			return (p->err = "leading zero", -1);
		v->type = TJ_NUM;
		v->num = strtod(p->s, &end);
		p->s = end;
		return 0;
	}
	p->err = "value expected";
	return -1;
}

static inline void tj_free(struct tj *v)
{
	for (int i = 0; i < v->n; i++) {
		tj_free(&v->items[i]);
		if (v->keys)
			free(v->keys[i]);
	}
	free(v->items);
	free(v->keys);
	free(v->str);
	memset(v, 0, sizeof(*v));
}

/* Parse a whole document: 0, or -1 with *err and the offset of the problem. */
static inline int tj_parse(const char *text, struct tj *v, const char **err, long *at)
{
	struct tj_parser p = { text, NULL };

	if (tj_value(&p, v) == 0) {
		tj_ws(&p);
		if (*p.s == '\0')
			return 0;
		p.err = "trailing characters";
	}
	tj_free(v);
	*err = p.err ? p.err : "out of memory";
	*at = (long)(p.s - text);
	return -1;
}

static inline const struct tj *tj_get(const struct tj *v, const char *key)
{
	for (int i = 0; v && v->type == TJ_OBJ && i < v->n; i++)
		if (!strcmp(v->keys[i], key))
			return &v->items[i];
	return NULL;
}

static inline const char *tj_str(const struct tj *v, const char *key)
{
	const struct tj *f = tj_get(v, key);

	return f && f->type == TJ_STR ? f->str : NULL;
}

/* The whole file, NUL-terminated, or NULL. */
static inline char *tj_slurp(const char *path)
{
	FILE *f = fopen(path, "r");
	char *buf = NULL;
	long len;

	if (!f)
		return NULL;
	if (fseek(f, 0, SEEK_END) == 0 && (len = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0 &&
	    (buf = malloc((size_t)len + 1)) != NULL) {
		if (fread(buf, 1, (size_t)len, f) != (size_t)len) {
			free(buf);
			buf = NULL;
		} else {
			buf[len] = '\0';
		}
	}
	fclose(f);
	return buf;
}

#endif

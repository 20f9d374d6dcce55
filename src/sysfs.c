/*
 * nccl-net-rail: sysfs access through one overridable root, and the
 * snapshot recorder behind rail-info --snapshot.
 *
 * Recording keeps the answer of every call the same when the snapshot is
 * read back with rail_sysfs_set_root(snapshot):
 *   - symlinks met while resolving a path are copied, their targets made
 *     relative so the snapshot can move;
 *   - the node a path resolves to is created (directory, or the file with
 *     the bytes read);
 *   - a listed directory gets every entry: links copied, subdirectories
 *     created, files as empty placeholders until they are read;
 *   - a file that exists but cannot be read (EINVAL from a sysfs attribute,
 *     e.g. gid_attrs/types/N of an unused GID) becomes an empty directory,
 *     so reading it back fails too (with EISDIR).
 */
#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"
#include "param.h"
#include "rail.h"
#include "sysfs.h"

static char sysfs_root[PATH_MAX];
static int sysfs_root_set;
static pthread_mutex_t sysfs_lock = PTHREAD_MUTEX_INITIALIZER;

static char record_dir[PATH_MAX];
static pthread_mutex_t record_lock = PTHREAD_MUTEX_INITIALIZER;

const char *rail_sysfs_root(void)
{
	pthread_mutex_lock(&sysfs_lock);
	if (!sysfs_root_set) {
		rail_strlcpy(sysfs_root, rail_param_str(RAIL_P_SYSFS_ROOT), sizeof(sysfs_root));
		if (!strcmp(sysfs_root, "/"))
			sysfs_root[0] = '\0';
		sysfs_root_set = 1;
	}
	pthread_mutex_unlock(&sysfs_lock);
	return sysfs_root;
}

void rail_sysfs_set_root(const char *root)
{
	pthread_mutex_lock(&sysfs_lock);
	rail_strlcpy(sysfs_root, root ? root : "", sizeof(sysfs_root));
	/* "/" and "" both mean the live system; drop a trailing '/'. */
	for (size_t n = strlen(sysfs_root); n > 0 && sysfs_root[n - 1] == '/'; n--)
		sysfs_root[n - 1] = '\0';
	sysfs_root_set = 1;
	pthread_mutex_unlock(&sysfs_lock);
}

int rail_sysfs_path(char *buf, size_t len, const char *path)
{
	int n = snprintf(buf, len, "%s%s", rail_sysfs_root(), path);

	return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

/* ---- recording ---------------------------------------------------------- */

/* out = a + b (+ "/" + c when c); -ENAMETOOLONG instead of truncating. */
static int join(char *out, const char *a, const char *b, const char *c)
{
	int n = c ? snprintf(out, PATH_MAX, "%s%s/%s", a, b, c) : snprintf(out, PATH_MAX, "%s%s", a, b);

	return n < 0 || n >= PATH_MAX ? -ENAMETOOLONG : 0;
}

static int recording(void)
{
	int on;

	pthread_mutex_lock(&record_lock);
	on = record_dir[0] != '\0';
	pthread_mutex_unlock(&record_lock);
	return on;
}

/* Lexically clean an absolute path: "//", "/./" and "/x/../" go. */
static void normalize(char *p)
{
	char out[PATH_MAX];
	size_t o = 0;
	const char *s = p;

	while (*s) {
		const char *e;
		size_t n;

		while (*s == '/')
			s++;
		e = strchr(s, '/');
		n = e ? (size_t)(e - s) : strlen(s);
		if (n == 0)
			break;
		if (n == 1 && s[0] == '.') {
		} else if (n == 2 && s[0] == '.' && s[1] == '.') {
			while (o > 0 && out[--o] != '/')
				;
		} else if (o + n + 2 < sizeof(out)) {
			out[o++] = '/';
			memcpy(out + o, s, n);
			o += n;
		}
		s += n;
	}
	out[o] = '\0';
	if (!o)
		rail_strlcpy(out, "/", sizeof(out));
	rail_strlcpy(p, out, PATH_MAX);
}

/* target as seen from the directory holding link (both absolute, clean). */
static void relative_to(const char *link, const char *target, char *out, size_t len)
{
	size_t common = 0, i, o = 0;
	const char *dir_end = strrchr(link, '/');
	size_t dir_len = dir_end ? (size_t)(dir_end - link) : 0;

	/* longest common prefix ending at a component boundary */
	for (i = 0; i <= dir_len && target[i] && link[i] == target[i]; i++)
		if (link[i] == '/')
			common = i;
	if (i == dir_len && (target[i] == '/' || !target[i]))
		common = i;
	for (i = common; i < dir_len; i++)
		if (link[i] == '/' && o + 3 < len) {
			memcpy(out + o, "../", 3);
			o += 3;
		}
	snprintf(out + o, len - o, "%s", target[common] == '/' ? target + common + 1 : target + common);
	if (!out[0])
		snprintf(out, len, ".");
}

static void mkdirs(const char *path, int include_last)
{
	char p[PATH_MAX];

	rail_strlcpy(p, path, sizeof(p));
	for (char *s = strchr(p + 1, '/'); s; s = strchr(s + 1, '/')) {
		*s = '\0';
		mkdir(p, 0755);
		*s = '/';
	}
	if (include_last)
		mkdir(p, 0755);
}

/* Something now lives in the directory of path: its marker can go. */
static void drop_keep(const char *path)
{
	char p[PATH_MAX];
	const char *slash = strrchr(path, '/');

	if (slash && snprintf(p, sizeof(p), "%.*s/%s", (int)(slash - path), path, RAIL_SYSFS_KEEP) <
			     (int)sizeof(p))
		unlink(p);
}

/*
 * Resolve path (a system path) one component at a time under root,
 * copying every symlink met into the record directory; real gets the
 * resolved, clean system path.
 */
static int resolve_and_copy(const char *root, const char *path, char *real)
{
	char cur[PATH_MAX];
	int err;

	rail_strlcpy(cur, path, sizeof(cur));
	normalize(cur);
	for (int depth = 0; depth < 40; depth++) {
		int found = 0;

		for (char *s = strchr(cur + 1, '/');; s = strchr(s + 1, '/')) {
			char src[PATH_MAX], dst[PATH_MAX], target[PATH_MAX], abs[PATH_MAX],
				rel[PATH_MAX];
			char save = s ? *s : '\0';
			ssize_t n;

			if (s)
				*s = '\0';
			n = join(src, root, cur, NULL) ? -1 : readlink(src, target, sizeof(target) - 1);
			if (n >= 0) {
				target[n] = '\0';
				char *slash = strrchr(cur, '/');

				*slash = '\0';
				err = target[0] == '/' ? join(abs, "", target, NULL)
						       : join(abs, cur, "", target);
				*slash = '/';
				if (err || join(dst, record_dir, cur, NULL))
					return -ENAMETOOLONG;
				normalize(abs);
				relative_to(cur, abs, rel, sizeof(rel));
				mkdirs(dst, 0);
				unlink(dst);
				rmdir(dst);
				drop_keep(dst);
				if (symlink(rel, dst) && errno != EEXIST)
					return -errno;
				if (s) {
					*s = save;
					strncat(abs, s, sizeof(abs) - strlen(abs) - 1);
				}
				rail_strlcpy(cur, abs, sizeof(cur));
				normalize(cur);
				found = 1;
				break;
			}
			if (s)
				*s = save;
			if (!s)
				break;
		}
		if (!found) {
			rail_strlcpy(real, cur, PATH_MAX);
			return 0;
		}
	}
	return -ELOOP;
}

/*
 * git keeps no empty directory: a snapshot's empty directories get a
 * ".keep" file, which rail_sysfs_list does not report.
 */
static void keep_marker(const char *dir)
{
	char p[PATH_MAX];
	DIR *d = opendir(dir);
	struct dirent *de;
	int empty = 1, fd;

	if (!d)
		return;
	while (empty && (de = readdir(d)))
		empty = !strcmp(de->d_name, ".") || !strcmp(de->d_name, "..");
	closedir(d);
	if (!empty || join(p, dir, "", RAIL_SYSFS_KEEP))
		return;
	fd = open(p, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
	if (fd >= 0)
		close(fd);
}

/* Create the resolved node: the directory, or a placeholder for a file. */
static void copy_node(const char *root, const char *real)
{
	char src[PATH_MAX], dst[PATH_MAX];
	struct stat st;

	if (join(src, root, real, NULL) || join(dst, record_dir, real, NULL) || lstat(src, &st))
		return;
	drop_keep(dst);
	if (S_ISDIR(st.st_mode)) {
		mkdirs(dst, 1);
		keep_marker(dst);
	} else if (access(dst, F_OK)) {
		int fd;

		mkdirs(dst, 0);
		fd = open(dst, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
		if (fd >= 0)
			close(fd);
	}
}

enum rec_kind { REC_NODE, REC_DATA, REC_FAIL };

static void record(enum rec_kind kind, const char *path, const char *data, size_t len)
{
	const char *root = rail_sysfs_root();
	char real[PATH_MAX], dst[PATH_MAX];

	pthread_mutex_lock(&record_lock);
	if (!record_dir[0] || resolve_and_copy(root, path, real) ||
	    join(dst, record_dir, real, NULL))
		goto out;
	if (kind == REC_NODE) {
		copy_node(root, real);
	} else if (kind == REC_DATA) {
		char keep[PATH_MAX];
		FILE *f;

		mkdirs(dst, 0);
		if (!join(keep, dst, "", RAIL_SYSFS_KEEP))
			unlink(keep); /* a directory placeholder of a failed read */
		rmdir(dst);
		drop_keep(dst);
		f = fopen(dst, "we");
		if (f) {
			fwrite(data, 1, len, f);
			fclose(f);
		}
	} else {
		char src[PATH_MAX];
		struct stat st;

		/* It exists but does not read: keep it that way in the copy. */
		if (!join(src, root, real, NULL) && !lstat(src, &st)) {
			unlink(dst);
			drop_keep(dst);
			mkdirs(dst, 1);
			keep_marker(dst);
		}
	}
out:
	pthread_mutex_unlock(&record_lock);
}

/* Every entry of a listed directory, so that the listing reads back equal. */
static void record_listing(const char *dir, char **names, size_t n)
{
	const char *root = rail_sysfs_root();
	char real[PATH_MAX];

	pthread_mutex_lock(&record_lock);
	if (!record_dir[0] || resolve_and_copy(root, dir, real))
		goto out;
	copy_node(root, real);
	for (size_t i = 0; i < n; i++) {
		char entry[PATH_MAX], src[PATH_MAX], dummy[PATH_MAX];
		struct stat st;

		if (join(entry, strcmp(real, "/") ? real : "", "", names[i]) ||
		    join(src, root, entry, NULL) || lstat(src, &st))
			continue;
		if (S_ISLNK(st.st_mode)) { /* copy the link itself, not its target */
			char t[PATH_MAX], abs[PATH_MAX], rel[PATH_MAX], dst[PATH_MAX];
			ssize_t len = readlink(src, t, sizeof(t) - 1);

			if (len < 0)
				continue;
			t[len] = '\0';
			if ((t[0] == '/' ? join(abs, "", t, NULL) : join(abs, real, "", t)) ||
			    join(dst, record_dir, entry, NULL))
				continue;
			normalize(abs);
			relative_to(entry, abs, rel, sizeof(rel));
			drop_keep(dst);
			if (readlink(dst, dummy, sizeof(dummy)) < 0 && symlink(rel, dst))
				continue;
		} else {
			copy_node(root, entry);
		}
	}
out:
	pthread_mutex_unlock(&record_lock);
}

/* ---- reading ------------------------------------------------------------ */

static const char *file_kind(mode_t m)
{
	return S_ISFIFO(m) ? "a FIFO" : S_ISSOCK(m) ? "a socket" : S_ISCHR(m) ? "a character device"
	       : S_ISBLK(m) ? "a block device" : "not a regular file";
}

/*
 * Attributes are regular files (directories fail with EISDIR at read, which
 * snapshots rely on). Anything else, in a damaged copy, could block or
 * never end: refused with -EINVAL.
 */
static int check_node(int fd, const char *full)
{
	struct stat st;

	if (fstat(fd, &st))
		return -errno;
	if (S_ISREG(st.st_mode) || S_ISDIR(st.st_mode))
		return 0;
	RAIL_WARN("sysfs: %s is %s, not an attribute file; is the sysfs root (%s) a damaged "
		  "copy? Check NCCL_RAIL_SYSFS_ROOT or rail-info --sysfs-root", full,
		  file_kind(st.st_mode), sysfs_root[0] ? sysfs_root : "/");
	return -EINVAL;
}

int rail_sysfs_read(const char *path, char *buf, size_t len)
{
	char full[PATH_MAX];
	ssize_t n;
	int fd, err;

	if (len == 0)
		return -EINVAL;
	err = rail_sysfs_path(full, sizeof(full), path);
	if (err)
		return err;
	/* O_NONBLOCK: opening a FIFO must not wait for a writer. */
	fd = open(full, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
	if (fd < 0) {
		err = -errno;
		if (err != -ENOENT && recording())
			record(REC_FAIL, path, NULL, 0);
		return err;
	}
	err = check_node(fd, full);
	if (err) {
		close(fd);
		return err;
	}
	n = read(fd, buf, len - 1);
	err = n < 0 ? -errno : 0;
	close(fd);
	if (recording())
		record(err ? REC_FAIL : REC_DATA, path, buf, err ? 0 : (size_t)n);
	if (err)
		return err;
	buf[n] = '\0';
	while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == ' '))
		buf[--n] = '\0';
	return (int)n;
}

int rail_sysfs_read_long(const char *path, long *out)
{
	char buf[64], *end;
	long v;
	int n = rail_sysfs_read(path, buf, sizeof(buf));

	if (n < 0)
		return n;
	errno = 0;
	v = strtol(buf, &end, 0);
	if (errno || end == buf)
		return -EINVAL;
	*out = v;
	return 0;
}

int rail_sysfs_read_hex(const char *path, unsigned long *out)
{
	char buf[64], *end;
	unsigned long v;
	int n = rail_sysfs_read(path, buf, sizeof(buf));

	if (n < 0)
		return n;
	errno = 0;
	v = strtoul(buf, &end, 16);
	if (errno || end == buf)
		return -EINVAL;
	*out = v;
	return 0;
}

int rail_sysfs_realpath(const char *path, char *out, size_t len)
{
	char full[PATH_MAX], real[PATH_MAX], rootreal[PATH_MAX] = "";
	const char *root = rail_sysfs_root();
	size_t rl = 0;
	int err = rail_sysfs_path(full, sizeof(full), path);

	if (err)
		return err;
	if (!realpath(full, real))
		return -errno;
	if (root[0]) {
		if (!realpath(root, rootreal))
			return -errno;
		rl = strlen(rootreal);
		if (!strcmp(rootreal, "/"))
			rl = 0;
		else if (strncmp(real, rootreal, rl) != 0 || (real[rl] != '/' && real[rl] != '\0'))
			return -EXDEV; /* a link escapes the fixture tree */
	}
	if (strlen(real + rl) >= len)
		return -ENAMETOOLONG;
	if (recording())
		record(REC_NODE, path, NULL, 0);
	rail_strlcpy(out, real[rl] ? real + rl : "/", len);
	return 0;
}

int rail_sysfs_exists(const char *path)
{
	char full[PATH_MAX];
	struct stat st;

	if (rail_sysfs_path(full, sizeof(full), path))
		return 0;
	if (stat(full, &st))
		return 0;
	if (recording())
		record(REC_NODE, path, NULL, 0);
	return 1;
}

static int cmp_names(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

int rail_sysfs_list(const char *dir, int (*fn)(const char *name, void *arg), void *arg)
{
	char full[PATH_MAX];
	char **names = NULL;
	size_t n = 0, cap = 0;
	struct dirent *de;
	DIR *d;
	int ret = 0;

	ret = rail_sysfs_path(full, sizeof(full), dir);
	if (ret)
		return ret;
	d = opendir(full);
	if (!d)
		return -errno;
	while ((de = readdir(d))) {
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..") ||
		    !strcmp(de->d_name, RAIL_SYSFS_KEEP))
			continue;
		if (n == cap) {
			char **nn = realloc(names, (cap = cap ? cap * 2 : 32) * sizeof(*names));

			if (!nn) {
				ret = -ENOMEM;
				break;
			}
			names = nn;
		}
		names[n] = strdup(de->d_name);
		if (!names[n]) {
			ret = -ENOMEM;
			break;
		}
		n++;
	}
	closedir(d);
	if (!ret) {
		if (n)
			qsort(names, n, sizeof(*names), cmp_names);
		if (recording())
			record_listing(dir, names, n);
		for (size_t i = 0; i < n && !ret; i++)
			ret = fn(names[i], arg);
	}
	for (size_t i = 0; i < n; i++)
		free(names[i]);
	free(names);
	return ret;
}

int rail_sysfs_record_start(const char *dir)
{
	char real[PATH_MAX];

	mkdirs(dir, 1);
	if (!realpath(dir, real))
		return -errno;
	pthread_mutex_lock(&record_lock);
	rail_strlcpy(record_dir, strcmp(real, "/") ? real : "", sizeof(record_dir));
	pthread_mutex_unlock(&record_lock);
	return record_dir[0] ? 0 : -EINVAL;
}

void rail_sysfs_record_stop(void)
{
	pthread_mutex_lock(&record_lock);
	record_dir[0] = '\0';
	pthread_mutex_unlock(&record_lock);
}

/* nccl-net-rail: sysfs access through one overridable root. */
#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "param.h"
#include "rail.h"
#include "sysfs.h"

static char sysfs_root[PATH_MAX];
static int sysfs_root_set;
static char record_dir[PATH_MAX];
static pthread_mutex_t sysfs_lock = PTHREAD_MUTEX_INITIALIZER;

const char *rail_sysfs_root(void)
{
	pthread_mutex_lock(&sysfs_lock);
	if (!sysfs_root_set) {
		rail_strlcpy(sysfs_root, rail_param_str(RAIL_P_SYSFS_ROOT), sizeof(sysfs_root));
		sysfs_root_set = 1;
	}
	pthread_mutex_unlock(&sysfs_lock);
	return sysfs_root;
}

void rail_sysfs_set_root(const char *root)
{
	pthread_mutex_lock(&sysfs_lock);
	rail_strlcpy(sysfs_root, root ? root : "", sizeof(sysfs_root));
	/* "/" and "" both mean the live system. */
	if (!strcmp(sysfs_root, "/"))
		sysfs_root[0] = '\0';
	sysfs_root_set = 1;
	pthread_mutex_unlock(&sysfs_lock);
}

int rail_sysfs_path(char *buf, size_t len, const char *path)
{
	int n = snprintf(buf, len, "%s%s", rail_sysfs_root(), path);

	return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

/* mkdir -p of the parent directories of a file under the record dir. */
static void record_mkdirs(char *p)
{
	for (char *s = strchr(p + 1, '/'); s; s = strchr(s + 1, '/')) {
		*s = '\0';
		mkdir(p, 0755);
		*s = '/';
	}
}

static void record_file(const char *path, const char *data, size_t len)
{
	char dst[PATH_MAX];
	FILE *f;

	if (!record_dir[0] || snprintf(dst, sizeof(dst), "%s%s", record_dir, path) >= (int)sizeof(dst))
		return;
	record_mkdirs(dst);
	f = fopen(dst, "w");
	if (!f)
		return;
	fwrite(data, 1, len, f);
	fclose(f);
}

/* Copy every symlink met while resolving path so that realpath works in the copy. */
static void record_links(const char *path)
{
	char cur[PATH_MAX], target[PATH_MAX], src[PATH_MAX], dst[PATH_MAX];

	if (!record_dir[0])
		return;
	rail_strlcpy(cur, path, sizeof(cur));
	for (int depth = 0; depth < 40; depth++) {
		char *slash;
		ssize_t n = -1;
		size_t i;

		/* Find the first component of cur that is a link. */
		for (i = 1; cur[i - 1]; i++) {
			if (cur[i] != '/' && cur[i] != '\0')
				continue;
			char save = cur[i];
			cur[i] = '\0';
			if (rail_sysfs_path(src, sizeof(src), cur) == 0)
				n = readlink(src, target, sizeof(target) - 1);
			if (n >= 0) {
				target[n] = '\0';
				if (snprintf(dst, sizeof(dst), "%s%s", record_dir, cur) < (int)sizeof(dst)) {
					record_mkdirs(dst);
					unlink(dst);
					if (symlink(target, dst) != 0)
						return;
				}
				cur[i] = save;
				break;
			}
			cur[i] = save;
			if (!save)
				return;
		}
		if (n < 0)
			return;
		/* Replace the link component by its target and continue. */
		char rest[PATH_MAX], next[PATH_MAX];
		rail_strlcpy(rest, cur + i, sizeof(rest));
		cur[i] = '\0';
		int len;
		if (target[0] == '/') {
			len = snprintf(next, sizeof(next), "%s%s", target, rest);
		} else {
			slash = strrchr(cur, '/');
			*slash = '\0';
			len = snprintf(next, sizeof(next), "%s/%s%s", cur, target, rest);
		}
		if (len < 0 || len >= (int)sizeof(next))
			return;
		rail_strlcpy(cur, next, sizeof(cur));
	}
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
	fd = open(full, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	n = read(fd, buf, len - 1);
	err = n < 0 ? -errno : 0;
	close(fd);
	if (err)
		return err;
	buf[n] = '\0';
	pthread_mutex_lock(&sysfs_lock);
	record_links(path);
	record_file(path, buf, (size_t)n);
	pthread_mutex_unlock(&sysfs_lock);
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
		if (strncmp(real, rootreal, rl) != 0 || (real[rl] != '/' && real[rl] != '\0'))
			return -EXDEV; /* a link escapes the fixture tree */
	}
	if (strlen(real + rl) >= len)
		return -ENAMETOOLONG;
	pthread_mutex_lock(&sysfs_lock);
	record_links(path);
	pthread_mutex_unlock(&sysfs_lock);
	rail_strlcpy(out, real + rl, len);
	return 0;
}

int rail_sysfs_exists(const char *path)
{
	char full[PATH_MAX];
	struct stat st;

	if (rail_sysfs_path(full, sizeof(full), path))
		return 0;
	return stat(full, &st) == 0;
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
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
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
		qsort(names, n, sizeof(*names), cmp_names);
		pthread_mutex_lock(&sysfs_lock);
		record_links(dir);
		pthread_mutex_unlock(&sysfs_lock);
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
	if (mkdir(dir, 0755) && errno != EEXIST)
		return -errno;
	pthread_mutex_lock(&sysfs_lock);
	if (!realpath(dir, record_dir))
		record_dir[0] = '\0';
	pthread_mutex_unlock(&sysfs_lock);
	return record_dir[0] ? 0 : -ENOENT;
}

void rail_sysfs_record_stop(void)
{
	pthread_mutex_lock(&sysfs_lock);
	record_dir[0] = '\0';
	pthread_mutex_unlock(&sysfs_lock);
}

/*
 * nccl-net-rail: every sysfs read goes through here, relative to one root
 * ("" = the live /sys tree's parent, i.e. real paths) that tests and
 * rail-info --sysfs-root point at a copy. Paths passed in are absolute
 * system paths such as "/sys/class/net/eth0/speed".
 */
#ifndef RAIL_SYSFS_H
#define RAIL_SYSFS_H

#include <stddef.h>
#include <stdint.h>

/* Root directory ("" for the live system). Defaults to NCCL_RAIL_SYSFS_ROOT. */
const char *rail_sysfs_root(void);
void rail_sysfs_set_root(const char *root);

/* root + path into buf; -ENAMETOOLONG if it does not fit. */
int rail_sysfs_path(char *buf, size_t len, const char *path);

/* Read a small text file, trailing newline removed. Returns length or -errno. */
int rail_sysfs_read(const char *path, char *buf, size_t len);
int rail_sysfs_read_long(const char *path, long *out);
/* Hex value such as "0x10de" or "10de". */
int rail_sysfs_read_hex(const char *path, unsigned long *out);

/*
 * Resolve symlinks of path inside the root; *out gets the resolved absolute
 * system path (root prefix removed), e.g. "/sys/devices/pci0000:00/0000:00:01.0".
 */
int rail_sysfs_realpath(const char *path, char *out, size_t len);

/* 1 if path exists under the root. */
int rail_sysfs_exists(const char *path);

/*
 * Call fn for each entry name of a directory (skipping ., .. and
 * RAIL_SYSFS_KEEP), in sorted order. Stops and returns fn's value when it
 * is non-zero.
 */
#define RAIL_SYSFS_KEEP ".keep" /* keeps an empty directory of a snapshot in git */
int rail_sysfs_list(const char *dir, int (*fn)(const char *name, void *arg), void *arg);

/*
 * Snapshot recording: while a directory is set, every file, link and
 * directory the calls above touch is copied into it, so that reading it
 * back with it as the root gives the same answers (rail-info --snapshot):
 * symlinks are copied with relative targets, listed directories get all
 * their entries (files as empty placeholders until read), and a file that
 * exists but cannot be read becomes a directory, so reading it fails again.
 * Recording is process-wide; start returns -errno if dir cannot be made.
 */
int rail_sysfs_record_start(const char *dir);
void rail_sysfs_record_stop(void);

#endif

/*
 * maildir.h - durable Maildir delivery (tmp/ -> fsync -> new/) and queue ids.
 *
 * A message is written through a 64 KiB buffered writer into DIR/tmp/<secs>.<queue id>.<host>,
 * created only when the buffer first fills or at commit (so a message that fits the buffer
 * holds no descriptor while its client sends it, and the loop makes no file system call for
 * it); at commit the file is flushed, fsync'd, closed, renamed into DIR/new/ and DIR/new is
 * fsync'd, so that the 250 reply goes out only once the message survives a crash. Any failure
 * removes the file.
 */
#ifndef SMTPE_HOST_MAILDIR_H
#define SMTPE_HOST_MAILDIR_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>

#define MAILDIR_QUEUE_ID_LEN 28   /* hex digits of a queue id, without the NUL */
#define MAILDIR_HOST_PART_MAX 1024 /* hostname with '/' and ':' escaped as \057 and \072 */

/* An open Maildir: directory descriptors kept for the life of the process. */
struct maildir {
    int root_fd;
    int tmp_fd;
    int new_fd;
    char host_part[MAILDIR_HOST_PART_MAX]; /* the hostname as it appears in file names */
};

/* Creates path (and its parents), path/tmp, path/new and path/cur as needed, and opens them.
 * Returns 0, or -1 with a message in err[0..errlen). */
/* Removes the regular files of tmp/ last modified more than max_age seconds before now: the
 * leftovers of deliveries cut short by a crash (the Maildir convention is 36 hours, long enough
 * that no delivery still running, ours or another agent's, is touched). Returns how many, or -1
 * if tmp/ cannot be read. */
long maildir_sweep_tmp(struct maildir *md, time_t now, time_t max_age);
#define MAILDIR_TMP_MAX_AGE (36 * 3600) /* seconds */

int maildir_open(struct maildir *md, const char *path, const char *hostname, char *err,
                 size_t errlen);

/* Closes the directory descriptors. */
void maildir_close(struct maildir *md);

/* Writes a new queue id (MAILDIR_QUEUE_ID_LEN upper-case hex digits and a NUL) into out: the
 * microsecond wall-clock time, the pid and a per-process counter, so ids are unique across
 * processes, threads and restarts. Safe to call from any thread. */
void maildir_queue_id(char out[MAILDIR_QUEUE_ID_LEN + 1]);

/* One message being written. */
struct maildir_msg;

/* Starts a message to be stored as tmp/<secs>.<queue_id>.<host> (created exclusively once the
 * buffer fills, or at commit) with its write buffer. Returns the message, or NULL with errno
 * set. */
struct maildir_msg *maildir_msg_begin(const struct maildir *md, const char *queue_id,
                                      time_t secs);

/* Appends len octets. Errors are sticky and reported by maildir_msg_commit.
 * Returns 0, or -1 once writing has failed. */
int maildir_msg_write(struct maildir_msg *m, const void *p, size_t len);

/* Makes the message durable in new/ and frees m. Returns 0, or -1 with errno set (the file is
 * then removed). */
int maildir_msg_commit(struct maildir_msg *m);

/* Removes the unfinished message and frees m. NULL is allowed. */
void maildir_msg_abort(struct maildir_msg *m);

#endif

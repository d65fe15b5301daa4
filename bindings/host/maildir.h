/*
 * maildir.h - durable Maildir delivery (tmp/ -> fsync -> new/) and queue ids.
 *
 * A message is written through a 64 KiB buffered writer into DIR/tmp/<secs>.<queue id>.<host>,
 * created only when the buffer first fills or at commit (so a message that fits the buffer
 * holds no descriptor while its client sends it, and the loop makes no file system call for
 * it); at commit the file is flushed, fsync'd, closed, renamed into DIR/new/ and DIR/new is
 * fsync'd, so that the 250 reply goes out only once the message survives a crash. Any failure
 * removes the file. One message may go to several mailboxes (struct maildir_box): the content
 * is written once, the other copies are made from that file at commit.
 *
 * Maildir paths from a template ("/var/mail/{domain}/{local}", maildir_expand) are made from a
 * recipient's forward-path; maildir_component makes one value safe as one path component.
 */
#ifndef SMTPE_HOST_MAILDIR_H
#define SMTPE_HOST_MAILDIR_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>

#define MAILDIR_QUEUE_ID_LEN 28   /* hex digits of a queue id, without the NUL */
#define MAILDIR_HOST_PART_MAX 1024 /* hostname with '/' and ':' escaped as \057 and \072 */
#define MAILDIR_ADDRESS_MAX 1024   /* longest Delivered-To address */

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

/* Writes into out[0..cap) the escaped hostname that ends Maildir file names ('/' and ':' as
 * \057 and \072, at most 200 octets). */
void maildir_host_part(char *out, size_t cap, const char *hostname);

/* Whether a --maildir value is a template: holds "{domain}" or "{local}". */
int maildir_is_template(const char *tmpl);

/* One value (a local-part or a domain) as one path component, appended to out at *len (cap
 * octets in all, NUL kept after): ASCII letters lower-cased, other octets (UTF-8 of SMTPUTF8
 * addresses too) kept, but '/', '%', NUL, control octets (< 0x20, 0x7f), ':' when colon is set,
 * and a leading '.' written as %XX (upper-case hex). Returns 0, or -1 if the value is empty
 * or the component would exceed NAME_MAX (255) or cap. */
int maildir_component(char *out, size_t cap, size_t *len, const uint8_t *p, size_t n, int colon);

/* The Maildir path of a template for local and domain (raw values, escaped here with
 * maildir_component; the domain with ':' escaped too), into out[0..cap). Text outside
 * "{domain}" and "{local}" is copied as it is. Returns 0, or -1 if a value is empty or a
 * component or the whole path is too long for a delivery under it (PATH_MAX with tmp/ and a
 * file name). */
int maildir_expand(char *out, size_t cap, const char *tmpl, const uint8_t *local,
                   size_t local_len, const uint8_t *domain, size_t domain_len);

/* Closes the directory descriptors. */
void maildir_close(struct maildir *md);

/* Writes a new queue id (MAILDIR_QUEUE_ID_LEN upper-case hex digits and a NUL) into out: the
 * microsecond wall-clock time, the pid and a per-process counter, so ids are unique across
 * processes, threads and restarts. Safe to call from any thread. */
void maildir_queue_id(char out[MAILDIR_QUEUE_ID_LEN + 1]);

/* One mailbox a message is delivered to (a Maildir): an open one (md), or one named by path
 * and opened (tmp/ new/ cur/ created, 0700, with missing parents) at delivery. */
struct maildir_box {
    const struct maildir *md; /* an open Maildir, or NULL: path is opened at delivery */
    char *path;               /* heap, NUL-terminated; NULL with md */
    char *address;            /* heap addr-spec for the Delivered-To line (RFC 9228); NULL: none */
    int error;                /* after maildir_msg_commit: 0 (durable in new/) or an errno */
    /* internal: the directories while delivering (md's, or opened from path) */
    int tmp_fd, new_fd, own_fds, made; /* made: 1 in tmp/, 2 in new/ */
};

/* maildir_msg_begin flags */
#define MAILDIR_LF (1u << 0)   /* store CRLF line ends as LF (Maildir convention); a bare CR is
                                  kept */
#define MAILDIR_LINK (1u << 1) /* copies are hard links of one file (no Delivered-To line,
                                  every box's address must be NULL); a copy where link(2) is
                                  refused across file systems */
#define MAILDIR_ALL (1u << 2)  /* all or nothing: when one box fails, the copies already durable
                                  are removed and every box reports the failure (SMTP: one
                                  reply for all recipients) */

/* One message being written. */
struct maildir_msg;

/* Starts a message for boxes[0..nbox) (nbox >= 1; the array is the caller's and must outlive
 * the message, and no two boxes may name the same directory), to be stored in each as
 * new/<secs>.<queue_id>.<host_part>. The content is written once, into the tmp/ of the first
 * box that opens (created exclusively once the buffer fills, or at commit), after that box's
 * Delivered-To line. Returns the message, or NULL with errno set. */
struct maildir_msg *maildir_msg_begin(struct maildir_box *boxes, size_t nbox,
                                      const char *host_part, const char *queue_id, time_t secs,
                                      unsigned flags);

/* Appends len octets (converted as flags say). Errors are sticky and reported by
 * maildir_msg_commit. Returns 0, or -1 once writing has failed. */
int maildir_msg_write(struct maildir_msg *m, const void *p, size_t len);

/* Makes a copy of the message durable in new/ of every box and frees m: the written file
 * fsync'd; each other copy its own Delivered-To line then the rest of the first file
 * (copy_file_range(2), or a read/write loop where the kernel refuses it), or with MAILDIR_LINK
 * a hard link; every copy fsync'd, renamed into its new/, and each new/ fsync'd. Each box's
 * error says its result. Returns 0 if every box succeeded, else -1 with errno set to the first
 * failure (the files of failed boxes removed; with MAILDIR_ALL those of all boxes). */
int maildir_msg_commit(struct maildir_msg *m);

/* Removes the unfinished message and frees m. NULL is allowed. */
void maildir_msg_abort(struct maildir_msg *m);

/* Closes what delivery opened in boxes[0..n) and frees their strings (not the array). */
void maildir_boxes_clear(struct maildir_box *boxes, size_t n);

#endif

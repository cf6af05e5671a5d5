/*
 * This file contains model repositories on object storage, Triton's
 * s3://, as:// (and gs://, refused: no client is built in). A remote
 * repository is mirrored into a private local directory, which the
 * repository code then scans and loads from like a local repository; a
 * sync brings the mirror in step with the bucket before each scan.
 *
 * The mirror is confined: it is only written through object keys checked
 * component by component (no "..", ".", empty or absolute part), into
 * files created with O_EXCL|O_NOFOLLOW, so no key and no symlink makes a
 * write land outside it. A model is downloaded into a temporary directory
 * beside it and renamed into place only when every one of its objects
 * arrived whole (and unchanged: the ETag the listing gave): a half
 * downloaded model never replaces a served one.
 */
#ifndef NEREID_STORAGE_H
#define NEREID_STORAGE_H

#include <stdbool.h>

#include "nereid/server.h"

typedef struct storage_remote storage_remote_t;

/* Whether path names object storage: s3://, as:// or gs://. */
bool storage_is_remote(const char *path);

/* Opens the remote repository url: parses it (Triton's syntax), picks its
 * credentials (TRITON_CLOUD_CREDENTIAL_PATH's JSON, else the environment:
 * AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN,
 * AWS_DEFAULT_REGION; AZURE_STORAGE_ACCOUNT, AZURE_STORAGE_KEY,
 * AZURE_STORAGE_CONNECTION_STRING) and makes its private mirror directory
 * (mode 0700, under TRITON_AWS_MOUNT_DIRECTORY / TRITON_AZURE_MOUNT_DIRECTORY
 * when set, else $TMPDIR or /tmp). Nothing is downloaded yet. On failure
 * NULL, and *err says what is wrong with the url or its credentials.
 * Caller frees with storage_remote_free. */
storage_remote_t *storage_remote_open(const char *url, nereid_error_t **err);

/* The mirror directory (borrowed until storage_remote_free). */
const char *storage_remote_dir(const storage_remote_t *r);
/* The url as given (borrowed until storage_remote_free). */
const char *storage_remote_url(const storage_remote_t *r);

/* Brings the mirror in step with the bucket: model's prefix only, or the
 * whole repository when model is NULL. Models whose objects (keys, ETags,
 * sizes) changed are downloaded again, in parallel, and swapped in; models
 * no longer in the bucket are removed from the mirror (only when the
 * listing succeeded). NULL on success; else an error naming the repository
 * and the cause (unreachable, denied, missing bucket, a download that
 * failed), and every model it could not bring in step stays as it was.
 * Serialized per repository; any thread. */
nereid_error_t *storage_remote_sync(storage_remote_t *r, const char *model);

/* Ends the transfers of a sync under way (it then fails, changing
 * nothing) and of every later one: for a server that stops. Any thread. */
void storage_remote_cancel(storage_remote_t *r);

/* Removes the mirror directory and frees r (NULL: nothing). */
void storage_remote_free(storage_remote_t *r);

#endif

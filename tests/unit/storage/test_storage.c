/*
 * This file contains unit tests of the object storage layer's pure parts:
 * the mirror's key checks (traversal, absolute paths, empty and dot
 * components), S3 and Azure listing pages (entities, pagination, bad
 * input), service error texts, URL encoding, and the parsing of Triton's
 * s3:// and as:// repository paths with their credentials.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "core/util.h"
#include "storage/storage_internal.h"

static void test_keys(void)
{
    CHECK(storage_check_key("config.pbtxt", false) == NULL);
    CHECK(storage_check_key("1/model.onnx", false) == NULL);
    CHECK(storage_check_key("1/sub/dir/weights.bin", false) == NULL);
    CHECK(storage_check_key("..hidden/x", false) == NULL); /* a name, not ".." */
    CHECK_STR(storage_check_key("../x", false), "a '..' path component");
    CHECK_STR(storage_check_key("1/../../x", false), "a '..' path component");
    CHECK_STR(storage_check_key("1/..", false), "a '..' path component");
    CHECK_STR(storage_check_key("./x", false), "a '.' path component");
    CHECK_STR(storage_check_key("/etc/passwd", false), "an absolute path");
    CHECK_STR(storage_check_key("1//x", false), "an empty path component");
    CHECK_STR(storage_check_key("1/", false), "an empty path component");
    CHECK_STR(storage_check_key("", false), "an empty path component");
    CHECK_STR(storage_check_key("a\nb", false), "a control character");
    char long_comp[300];
    memset(long_comp, 'a', sizeof long_comp - 1);
    long_comp[sizeof long_comp - 1] = 0;
    CHECK(storage_check_key(long_comp, false) != NULL);
    CHECK(storage_check_key("model", true) == NULL);
    CHECK(storage_check_key(".download-x", true) != NULL); /* the mirror's own names */
    CHECK(storage_check_key("..", true) != NULL);
    CHECK(storage_check_key("a/b", true) != NULL);
}

static void test_s3_listing(void)
{
    const char *page =
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
        "<ListBucketResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><Name>b</Name>"
        "<Prefix>r/</Prefix><KeyCount>2</KeyCount><IsTruncated>true</IsTruncated>"
        "<Contents><Key>r/m/config.pbtxt</Key><ETag>&quot;abc&quot;</ETag><Size>12</Size>"
        "</Contents><Contents><Key>r/a&amp;b/x&#x41;&#66;</Key><ETag>\"d\"</ETag><Size>0</Size>"
        "</Contents><NextContinuationToken>tok+/=</NextContinuationToken></ListBucketResult>";
    storage_listing_t l = {0};
    char *next = NULL;
    CHECK(storage_s3.parse_list(page, strlen(page), &l, &next) == 0);
    CHECK(l.n == 2);
    if (l.n == 2) {
        CHECK_STR(l.objects[0].key, "r/m/config.pbtxt");
        CHECK_STR(l.objects[0].etag, "abc");
        CHECK(l.objects[0].size == 12);
        CHECK_STR(l.objects[1].key, "r/a&b/xAB");
        CHECK_STR(l.objects[1].etag, "d");
    }
    CHECK_STR(next, "tok+/=");
    free(next);
    storage_listing_clear(&l);
    /* Bad pages: no listing, a negative or missing size, a NUL reference,
     * truncated without a token. */
    const char *bad[] = {
        "<Error><Code>x</Code></Error>",
        "<ListBucketResult><Contents><Key>k</Key><ETag>e</ETag><Size>-1</Size></Contents>"
        "</ListBucketResult>",
        "<ListBucketResult><Contents><Key>k</Key><ETag>e</ETag></Contents></ListBucketResult>",
        "<ListBucketResult><Contents><Key>k&#0;</Key><ETag>e</ETag><Size>1</Size></Contents>"
        "</ListBucketResult>",
        "<ListBucketResult><Contents><Key>k&bogus;</Key><ETag>e</ETag><Size>1</Size></Contents>"
        "</ListBucketResult>",
        "<ListBucketResult><IsTruncated>true</IsTruncated></ListBucketResult>",
        "<ListBucketResult><Contents><Key>unterminated",
    };
    for (size_t i = 0; i < ARRAY_LEN(bad); i++) {
        int rc = storage_s3.parse_list(bad[i], strlen(bad[i]), &l, &next);
        CHECK_MSG(rc == -1 && next == NULL, "bad page %zu", i);
        storage_listing_clear(&l);
    }
}

static void test_azure_listing(void)
{
    const char *page =
        "\xef\xbb\xbf<?xml version=\"1.0\" encoding=\"utf-8\"?><EnumerationResults "
        "ServiceEndpoint=\"http://127.0.0.1:10000/devstoreaccount1\" ContainerName=\"c\">"
        "<Prefix>r/</Prefix><Blobs><Blob><Name>r/m/1/model.onnx</Name><Properties>"
        "<Creation-Time>Wed</Creation-Time><Etag>0x8DC1</Etag><Content-Length>3</Content-Length>"
        "</Properties></Blob></Blobs><NextMarker /></EnumerationResults>";
    storage_listing_t l = {0};
    char *next = (char *)1;
    CHECK(storage_azure.parse_list(page, strlen(page), &l, &next) == 0);
    CHECK(next == NULL);
    CHECK(l.n == 1 && strcmp(l.objects[0].key, "r/m/1/model.onnx") == 0 &&
          strcmp(l.objects[0].etag, "0x8DC1") == 0 && l.objects[0].size == 3);
    storage_listing_clear(&l);
    const char *more = "<EnumerationResults><Blobs></Blobs><NextMarker>2!8!abc</NextMarker>"
                       "</EnumerationResults>";
    CHECK(storage_azure.parse_list(more, strlen(more), &l, &next) == 0);
    CHECK_STR(next, "2!8!abc");
    free(next);
    storage_listing_clear(&l);
}

static void test_text(void)
{
    char *t = storage_error_text("<Error><Code>NoSuchBucket</Code><Message>The specified bucket "
                                 "does not exist</Message></Error>",
                                 strlen("<Error><Code>NoSuchBucket</Code><Message>The specified "
                                        "bucket does not exist</Message></Error>"));
    CHECK_STR(t, "NoSuchBucket: The specified bucket does not exist");
    free(t);
    const char *az = "<Error><Code>AuthorizationFailure</Code><Message>Server failed.\n"
                     "RequestId:1\nTime:2</Message></Error>";
    t = storage_error_text(az, strlen(az));
    CHECK_STR(t, "AuthorizationFailure: Server failed.");
    free(t);
    t = storage_error_text("not xml\x01", 8);
    CHECK_STR(t, "not xml ");
    free(t);
    t = storage_url_encode("a b/c+d~é", true);
    CHECK_STR(t, "a%20b/c%2Bd~%C3%A9");
    free(t);
    t = storage_url_encode("a/b", false);
    CHECK_STR(t, "a%2Fb");
    free(t);
}

static void test_paths(void)
{
    setenv("TMPDIR", "/tmp", 1);
    unsetenv("TRITON_CLOUD_CREDENTIAL_PATH");
    unsetenv("TRITON_AWS_MOUNT_DIRECTORY");
    unsetenv("AZURE_STORAGE_CONNECTION_STRING");
    setenv("AWS_ACCESS_KEY_ID", "AK", 1);
    setenv("AWS_SECRET_ACCESS_KEY", "SK", 1);
    setenv("AWS_DEFAULT_REGION", "eu-west-3", 1);
    struct {
        const char *url, *endpoint, *bucket, *prefix;
    } ok[] = {
        {"s3://bucket", "https://s3.eu-west-3.amazonaws.com", "bucket", ""},
        {"s3://bucket/path/to//repo/", "https://s3.eu-west-3.amazonaws.com", "bucket",
         "path/to/repo/"},
        {"s3://localhost:9000/b/repo", "http://localhost:9000", "b", "repo/"},
        {"s3://https://minio.local:443/b", "https://minio.local:443", "b", ""},
        {"as://acct/cont/p/q/", "https://acct.blob.core.windows.net", "cont", "p/q/"},
        {"as://acct.blob.core.windows.net/cont", "https://acct.blob.core.windows.net", "cont", ""},
    };
    for (size_t i = 0; i < ARRAY_LEN(ok); i++) {
        nereid_error_t *err = NULL;
        storage_remote_t *r = storage_remote_open(ok[i].url, &err);
        CHECK_MSG(r != NULL, "%s: %s", ok[i].url, err ? nereid_error_message(err) : "");
        if (!r) {
            nereid_error_free(err);
            continue;
        }
        CHECK_STR(r->endpoint, ok[i].endpoint);
        CHECK_STR(r->bucket, ok[i].bucket);
        CHECK_STR(r->prefix, ok[i].prefix);
        if (strncmp(ok[i].url, "s3", 2) == 0) {
            CHECK_STR(r->key_id, "AK");
            CHECK_STR(r->region, "eu-west-3");
        }
        storage_remote_free(r);
    }
    struct {
        const char *url, *err;
    } bad[] = {
        {"s3://", "Invalid bucket name: ''"},
        {"s3:///", "Invalid bucket name"},
        {"s3://bu?cket/x", "Invalid bucket name: 'bu?cket'"},
        {"s3://host:notaport/repo", "Invalid bucket name: 'host:notaport'"},
        {"gs://bucket", "gs:// model repositories are not supported"},
        {"as://acct", "Invalid azure storage path: as://acct"},
        {"as://acct/", "Invalid azure storage path"},
        {"as://acct/co%nt", "Invalid container name"},
    };
    for (size_t i = 0; i < ARRAY_LEN(bad); i++) {
        nereid_error_t *err = NULL;
        storage_remote_t *r = storage_remote_open(bad[i].url, &err);
        CHECK_MSG(r == NULL && err, "%s opened", bad[i].url);
        if (err) CHECK_STR_CONTAINS(nereid_error_message(err), bad[i].err);
        nereid_error_free(err);
        storage_remote_free(r);
    }
    /* A connection string gives the endpoint, account and key. */
    setenv("AZURE_STORAGE_CONNECTION_STRING",
           "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey=a2V5;"
           "BlobEndpoint=http://127.0.0.1:10000/devstoreaccount1/;",
           1);
    nereid_error_t *err = NULL;
    storage_remote_t *r = storage_remote_open("as://whatever/c", &err);
    CHECK(r != NULL);
    if (r) {
        CHECK_STR(r->endpoint, "http://127.0.0.1:10000/devstoreaccount1");
        CHECK_STR(r->account, "devstoreaccount1");
        CHECK(r->account_key_len == 3 && memcmp(r->account_key, "key", 3) == 0);
    }
    storage_remote_free(r);
    nereid_error_free(err);
    setenv("AZURE_STORAGE_CONNECTION_STRING", "BlobEndpoint=ftp://x/", 1);
    r = storage_remote_open("as://a/c", &err);
    CHECK(r == NULL);
    if (err) CHECK_STR_CONTAINS(nereid_error_message(err), "is not an http:// or https:// URL");
    nereid_error_free(err);
    unsetenv("AZURE_STORAGE_CONNECTION_STRING");
    /* TRITON_CLOUD_CREDENTIAL_PATH's "as" section: the longest name that
     * starts the path. */
    char cred_path[] = "/tmp/nereid-test-creds-XXXXXX";
    int fd = mkstemp(cred_path);
    const char *json = "{\"as\": {\"\": {\"account_str\": \"short\"}, \"as://acct/c\": "
                       "{\"account_str\": \"other\", \"account_key\": \"a2V5\"}}}";
    CHECK(fd >= 0 && write(fd, json, strlen(json)) == (ssize_t)strlen(json));
    close(fd);
    setenv("TRITON_CLOUD_CREDENTIAL_PATH", cred_path, 1);
    r = storage_remote_open("as://acct/c/repo", &err);
    CHECK(r != NULL);
    if (r) {
        CHECK_STR(r->account, "other");
        CHECK_STR(r->endpoint, "https://other.blob.core.windows.net");
        CHECK(r->account_key_len == 3 && memcmp(r->account_key, "key", 3) == 0);
    }
    storage_remote_free(r);
    nereid_error_free(err);
    r = storage_remote_open("s3://b/x", &err); /* no "s3" section */
    CHECK(r == NULL);
    if (err)
        CHECK_STR_CONTAINS(nereid_error_message(err), "Cannot match credential for path  s3://b/x");
    nereid_error_free(err);
    unlink(cred_path);
    unsetenv("TRITON_CLOUD_CREDENTIAL_PATH");
    setenv("AWS_DEFAULT_REGION", "us-east-1\r\nX-Injected: 1", 1);
    r = storage_remote_open("s3://b", &err);
    CHECK(r == NULL);
    if (err) CHECK_STR_CONTAINS(nereid_error_message(err), "invalid AWS region");
    nereid_error_free(err);
}

int main(void)
{
    test_keys();
    test_s3_listing();
    test_azure_listing();
    test_text();
    test_paths();
    return check_summary();
}

// A real client for the object storage emulators of
// tests/integration/test_storage.py: uploads, replaces and deletes objects
// with the AWS SDK (S3) and the Azure SDK (Blob).
//
//   node client.mjs s3 <endpoint> <key-id> <secret> <command> ...
//   node client.mjs as <connection-string> <command> ...
// commands: mkbucket <bucket> | put-dir <bucket> <prefix> <dir>
//           | put <bucket> <key> <file> | rm-prefix <bucket> <prefix>
import { readFileSync, readdirSync, statSync } from "node:fs";
import { join } from "node:path";

function files(dir, rel = "") {
  const out = [];
  for (const name of readdirSync(join(dir, rel)).sort()) {
    const r = rel ? `${rel}/${name}` : name;
    if (statSync(join(dir, r)).isDirectory()) out.push(...files(dir, r));
    else out.push(r);
  }
  return out;
}

async function pool(items, n, fn) {
  let next = 0;
  await Promise.all(Array.from({ length: Math.min(n, items.length) }, async () => {
    while (next < items.length) await fn(items[next++]);
  }));
}

async function s3(args) {
  const { S3Client, CreateBucketCommand, PutObjectCommand, ListObjectsV2Command, DeleteObjectsCommand } =
    await import("@aws-sdk/client-s3");
  const [endpoint, keyId, secret, cmd, ...rest] = args;
  const c = new S3Client({
    endpoint, region: "us-east-1", forcePathStyle: true,
    credentials: { accessKeyId: keyId, secretAccessKey: secret },
  });
  const put = (Bucket, Key, file) => c.send(new PutObjectCommand({ Bucket, Key, Body: readFileSync(file) }));
  if (cmd === "mkbucket") await c.send(new CreateBucketCommand({ Bucket: rest[0] }));
  else if (cmd === "put") await put(rest[0], rest[1], rest[2]);
  else if (cmd === "put-dir") {
    const [bucket, prefix, dir] = rest;
    await pool(files(dir), 16, (f) => put(bucket, prefix + f, join(dir, f)));
  } else if (cmd === "rm-prefix") {
    const [Bucket, Prefix] = rest;
    for (;;) {
      const l = await c.send(new ListObjectsV2Command({ Bucket, Prefix }));
      if (!l.Contents || !l.Contents.length) break;
      await c.send(new DeleteObjectsCommand({ Bucket, Delete: { Objects: l.Contents.map((o) => ({ Key: o.Key })) } }));
    }
  } else throw new Error(`unknown s3 command ${cmd}`);
}

async function as(args) {
  const { BlobServiceClient } = await import("@azure/storage-blob");
  const [conn, cmd, ...rest] = args;
  const svc = BlobServiceClient.fromConnectionString(conn);
  const put = (container, key, file) => {
    const data = readFileSync(file);
    return svc.getContainerClient(container).getBlockBlobClient(key).upload(data, data.length);
  };
  if (cmd === "mkbucket") await svc.getContainerClient(rest[0]).create();
  else if (cmd === "put") await put(rest[0], rest[1], rest[2]);
  else if (cmd === "put-dir") {
    const [container, prefix, dir] = rest;
    await pool(files(dir), 16, (f) => put(container, prefix + f, join(dir, f)));
  } else if (cmd === "rm-prefix") {
    const [container, prefix] = rest;
    const cc = svc.getContainerClient(container);
    for await (const b of cc.listBlobsFlat({ prefix })) await cc.deleteBlob(b.name);
  } else throw new Error(`unknown as command ${cmd}`);
}

const [kind, ...args] = process.argv.slice(2);
try {
  await (kind === "s3" ? s3(args) : kind === "as" ? as(args) : Promise.reject(new Error(`unknown service ${kind}`)));
} catch (e) {
  console.error(`client.mjs ${kind} ${args.slice(kind === "s3" ? 3 : 1).join(" ")}: ${e.name}: ${e.message}`);
  process.exit(1);
}

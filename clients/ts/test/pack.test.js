// The package as a team installs it: `npm pack` makes the tarball, a
// scratch project installs it (its dependencies from the npm cache that
// make test-ts's npm ci filled, so no download when nothing changed), and a
// program there imports it by its public name and talks to a real delayd.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { startDelayd } from "./delayd.js";

const execFileP = promisify(execFile);
const pkgDir = fileURLToPath(new URL("..", import.meta.url));

let delayd;
let scratch;

before(async () => {
  delayd = await startDelayd();
  scratch = await mkdtemp(join(tmpdir(), "delayd-ts-pack-"));
});

after(async () => {
  delayd?.stop();
  if (scratch) await rm(scratch, { recursive: true, force: true });
});

test("npm pack's tarball installs into a new project and works against delayd", async () => {
  const { stdout } = await execFileP("npm", ["pack", "--json", "--pack-destination", scratch], { cwd: pkgDir });
  const [packed] = JSON.parse(stdout);
  const files = packed.files.map((f) => f.path);
  for (const want of ["package.json", "README.md", "src/publisher.js", "src/publisher.d.ts", "src/gen/delayd/v1/task_pb.js", "src/gen/delayd/v1/task_pb.d.ts", "src/gen/delayd/v1/delivery_pb.js"]) {
    assert.ok(files.includes(want), `the tarball lacks ${want}: ${files.join(", ")}`);
  }
  for (const f of files) {
    assert.ok(!f.startsWith("test/") && !f.startsWith("node_modules/") && f !== "buf.gen.yaml", `the tarball ships ${f}`);
  }
  const manifest = JSON.parse(await readFile(join(pkgDir, "package.json"), "utf8"));
  assert.notEqual(manifest.private, true, "package.json is private: npm publish would refuse it");

  await writeFile(join(scratch, "package.json"), JSON.stringify({ name: "scratch", private: true, type: "module" }));
  await execFileP("npm", ["install", "--prefer-offline", "--no-audit", "--no-fund", "--loglevel=error", join(scratch, packed.filename)], { cwd: scratch });

  // A program of the scratch project, importing the package by name only.
  await writeFile(
    join(scratch, "use.js"),
    `import { createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { TaskService } from "@delayd/client/gen/delayd/v1/task_pb.js";
import { Publisher } from "@delayd/client/publisher";
const tasks = createClient(TaskService, createConnectTransport({ baseUrl: process.argv[2], httpVersion: "1.1" }));
const pub = new Publisher(tasks);
await Promise.all([1, 2, 3].map((n) => pub.upsertTask({ namespace: "ts-pack", id: "packed-" + n, when: { case: "delay", value: { seconds: 60n } } })));
await pub.close();
const got = await tasks.getTask({ namespace: "ts-pack", id: "packed-2" });
console.log("got " + got.task.id);
`,
  );
  const run = await execFileP(process.execPath, ["use.js", delayd.baseUrl], { cwd: scratch });
  assert.match(run.stdout, /got packed-2/);
});

// Starts the delayd binary in DELAYD_BIN (make test-ts builds it) in
// embedded mode on free loopback ports, for the tests that talk to a real
// delayd; resolves to { baseUrl, stop }. args are more flags.
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { createInterface } from "node:readline";

export async function startDelayd(args = []) {
  const bin = process.env.DELAYD_BIN;
  assert.ok(bin, "DELAYD_BIN must name a delayd binary (make test-ts builds bin/delayd-race)");
  // Every listener on a free port: a delayd already running on this
  // machine (make run holds 7070, 7071 and 9070) must not stop this one.
  // None of the caller's DELAYD_* settings (an exported DELAYD_ADMIN_KEY
  // would turn auth on): embedded mode, as make run.
  const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith("DELAYD_")));
  const delayd = spawn(bin, ["--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0", "--ops-listen", "127.0.0.1:0", "--log-level", "info", ...args], {
    env,
    stdio: ["ignore", "ignore", "pipe"],
  });
  // The serving line names the HTTP edge's address.
  const seen = [];
  const baseUrl = await new Promise((resolve, reject) => {
    const lines = createInterface({ input: delayd.stderr });
    lines.on("line", (line) => {
      seen.push(line);
      const m = /msg="delayd serving" .*http_addr=(\S+)/.exec(line);
      if (m) resolve(`http://${m[1]}`);
    });
    // "close" comes after its stderr ended: its last lines say why (e.g.
    // "ops listen on ...: address already in use").
    delayd.on("close", (code) => reject(new Error(`delayd exited (${code}) before serving:\n${seen.slice(-3).join("\n")}`)));
  });
  return { baseUrl, stop: () => delayd.kill("SIGTERM") };
}

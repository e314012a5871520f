// Drives Paddock's Rivet actors API with Rivet's own generated client
// (@rivetkit/engine-api-full). Run by TestRivetClient (host/rivetapi) with
// node --test against a real Paddock host over SQLite:
//   PADDOCK_URL    the server's base URL
//   PADDOCK_TOKEN  its bearer token
// Agents "notes" (answers every message) and "faulty" (misbehaves on
// request) are registered; both run in pool "default".
import { test } from "node:test";
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import rivet from "@rivetkit/engine-api-full";

const { RivetClient, RivetError } = rivet;
const base = process.env.PADDOCK_URL;
const token = process.env.PADDOCK_TOKEN;
assert.ok(base, "PADDOCK_URL is not set");
const client = new RivetClient({ environment: base, token });
const namespace = "default";
const b64 = (s) => Buffer.from(s).toString("base64");
const uniq = (p) => `${p}-${randomUUID()}`;

// rivetError runs f, which must fail with Rivet's error shape, and returns
// the error's status and body.
async function rivetError(f) {
  try {
    await f();
  } catch (e) {
    assert.ok(e instanceof RivetError, `want a RivetError, got ${e}`);
    assert.equal(typeof e.body, "object", `error body: ${JSON.stringify(e.body)}`);
    for (const k of ["group", "code", "message"]) {
      assert.equal(typeof e.body[k], "string", `error body lacks ${k}: ${JSON.stringify(e.body)}`);
    }
    return { status: e.statusCode, body: e.body };
  }
  assert.fail("the call succeeded; want a Rivet error");
}

async function byId(actorId) {
  const res = await client.actorsList({ namespace, actorIds: actorId });
  assert.equal(res.actors.length, 1, `actor ${actorId}: ${JSON.stringify(res)}`);
  return res.actors[0];
}

// waitFor polls f until it returns a truthy value (deadline 60 s: the
// machine is slow and shared; nothing here asserts a duration).
async function waitFor(what, f) {
  const deadline = Date.now() + 60_000;
  let last;
  for (;;) {
    last = await f();
    if (last) return last;
    if (Date.now() > deadline) assert.fail(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

// v1 calls Paddock's own API (signals and events have no Rivet route).
async function v1(method, path, body) {
  const res = await fetch(base + path, {
    method,
    headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const json = await res.json();
  assert.ok(res.ok, `${method} ${path}: ${res.status} ${JSON.stringify(json)}`);
  return json;
}

async function signal(agent, actorId, message) {
  const r = await v1("POST", `/v1/agents/${agent}/sessions/${actorId}/signals`, { message });
  return r.event_id;
}

test("create answers Rivet's actor object", async () => {
  const before = Date.now();
  const key = uniq("create");
  const { actor } = await client.actorsCreate({
    namespace, name: "notes", key, input: b64("hello"), runnerNameSelector: "default", crashPolicy: "restart",
  });
  assert.equal(typeof actor.actorId, "string");
  assert.equal(actor.name, "notes");
  assert.equal(actor.key, key);
  assert.equal(actor.namespaceId, "default");
  assert.equal(actor.runnerNameSelector, "default");
  assert.equal(actor.crashPolicy, "restart");
  assert.ok(actor.createTs >= before - 5_000 && actor.createTs <= Date.now() + 5_000, `create_ts ${actor.createTs} is not ms since the epoch`);
  assert.equal(actor.startTs, actor.createTs);
  assert.equal(actor.connectableTs, actor.createTs);
  assert.equal(actor.destroyTs ?? null, null);
  assert.equal(actor.sleepTs ?? null, null);

  // The same key again: Rivet's actor.duplicate_key naming the actor.
  const { status, body } = await rivetError(() =>
    client.actorsCreate({ namespace, name: "notes", key, runnerNameSelector: "default", crashPolicy: "restart" }));
  assert.equal(status, 400);
  assert.equal(body.group, "actor");
  assert.equal(body.code, "duplicate_key");
  assert.equal(body.metadata.existing_actor_id, actor.actorId);
  assert.equal(body.metadata.key, key);

  // Paddock's own API sees the session with the input decoded.
  const s = await v1("GET", `/v1/agents/notes/sessions/${actor.actorId}`);
  assert.equal(Buffer.from(s.input, "base64").toString(), "hello");
});

test("get-or-create from 20 clients at once makes one actor", async () => {
  const key = uniq("race");
  const clients = Array.from({ length: 20 }, () => new RivetClient({ environment: base, token }));
  const res = await Promise.all(clients.map((c, i) =>
    c.actorsGetOrCreate({
      namespace, name: "notes", key, runnerNameSelector: "default",
      // Rivet's rule: an existing actor wins whatever policy or input is sent.
      crashPolicy: ["restart", "sleep", "destroy"][i % 3], input: b64(`client ${i}`),
    })));
  const ids = new Set(res.map((r) => r.actor.actorId));
  assert.equal(ids.size, 1, `actor ids: ${[...ids]}`);
  assert.equal(res.filter((r) => r.created).length, 1, "exactly one call created the actor");
  const listed = await client.actorsList({ namespace, name: "notes", key });
  assert.deepEqual(listed.actors.map((a) => a.actorId), [...ids]);
});

test("list by id, by name and key, by name with paging", async () => {
  const name = "faulty";
  const made = [];
  for (let i = 0; i < 5; i++) {
    const { actor } = await client.actorsCreate({ namespace, name, runnerNameSelector: "default", crashPolicy: "sleep" });
    made.push(actor.actorId);
  }
  const keyed = (await client.actorsGetOrCreate({ namespace, name, key: uniq("list"), runnerNameSelector: "default", crashPolicy: "sleep" })).actor;

  const two = await client.actorsList({ namespace, actorIds: `${made[0]},${made[1]}` });
  assert.deepEqual(new Set(two.actors.map((a) => a.actorId)), new Set(made.slice(0, 2)));

  const k = await client.actorsList({ namespace, name, key: keyed.key });
  assert.deepEqual(k.actors.map((a) => a.actorId), [keyed.actorId]);
  const none = await client.actorsList({ namespace, name, key: uniq("nobody") });
  assert.deepEqual(none.actors, []);

  const seen = [];
  let cursor;
  for (let pages = 0; ; pages++) {
    assert.ok(pages < 100, "paging does not end");
    const page = await client.actorsList({ namespace, name, limit: 2, cursor });
    assert.ok(page.actors.length <= 2);
    if (page.actors.length === 0) break;
    seen.push(...page.actors.map((a) => a.actorId));
    cursor = page.pagination.cursor;
    assert.ok(cursor, "a non-empty page has a cursor");
  }
  assert.equal(new Set(seen).size, seen.length, "no actor on two pages");
  for (const id of [...made, keyed.actorId]) assert.ok(seen.includes(id), `actor ${id} not listed`);
  for (const a of seen) assert.ok(a);

  const { body } = await rivetError(() => client.actorsList({ namespace, key: "k" }));
  assert.equal(`${body.group}.${body.code}`, "validation.invalid_input");
});

test("destroy", async () => {
  const key = uniq("destroy");
  const { actor } = await client.actorsGetOrCreate({ namespace, name: "notes", key, runnerNameSelector: "default", crashPolicy: "restart" });
  assert.deepEqual(await client.actorsDelete(actor.actorId, { namespace }), {});
  const gone = await byId(actor.actorId);
  assert.equal(typeof gone.destroyTs, "number");
  assert.equal(gone.connectableTs ?? null, null);
  // Listing by name leaves destroyed actors out unless asked.
  assert.deepEqual((await client.actorsList({ namespace, name: "notes", key })).actors, []);
  const all = await client.actorsList({ namespace, name: "notes", key, includeDestroyed: true });
  assert.deepEqual(all.actors.map((a) => a.actorId), [actor.actorId]);
  // Idempotent; a destroyed actor's key makes a new actor.
  assert.deepEqual(await client.actorsDelete(actor.actorId, { namespace }), {});
  const again = await client.actorsGetOrCreate({ namespace, name: "notes", key, runnerNameSelector: "default", crashPolicy: "restart" });
  assert.equal(again.created, true);
  assert.notEqual(again.actor.actorId, actor.actorId);

  const { status, body } = await rivetError(() => client.actorsDelete(randomUUID(), { namespace }));
  assert.equal(status, 400);
  assert.equal(`${body.group}.${body.code}`, "actor.not_found");
});

test("Rivet's errors: namespace, pool, key, input, fields", async () => {
  const cases = [
    ["namespace.not_found", () => client.actorsList({ namespace: "other", name: "notes" })],
    ["namespace.not_found", () => client.actorsCreate({ namespace: "other", name: "notes", runnerNameSelector: "default", crashPolicy: "sleep" })],
    ["actor.no_runner_config_configured", () => client.actorsCreate({ namespace, name: "notes", runnerNameSelector: "gpu", crashPolicy: "sleep" })],
    ["actor.empty_key", () => client.actorsCreate({ namespace, name: "notes", key: "", runnerNameSelector: "default", crashPolicy: "sleep" })],
    ["actor.key_too_large", () => client.actorsGetOrCreate({ namespace, name: "notes", key: "k".repeat(1025), runnerNameSelector: "default", crashPolicy: "sleep" })],
    ["actor.input_too_large", () => client.actorsCreate({ namespace, name: "notes", input: b64("x".repeat((1 << 20) + 1)), runnerNameSelector: "default", crashPolicy: "sleep" })],
    ["validation.invalid_input", () => client.actorsCreate({ namespace, name: "nobody", runnerNameSelector: "default", crashPolicy: "sleep" })],
    ["validation.too_many_actor_ids", () => client.actorsList({ namespace, actorIds: Array.from({ length: 33 }, () => randomUUID()).join(",") })],
  ];
  for (const [want, f] of cases) {
    const { status, body } = await rivetError(f);
    assert.equal(`${body.group}.${body.code}`, want, JSON.stringify(body));
    assert.equal(status, 400, want);
  }
  const bad = new RivetClient({ environment: base, token: "wrong" });
  const { status, body } = await rivetError(() => bad.actorsList({ namespace, name: "notes" }));
  assert.equal(status, 401);
  assert.equal(`${body.group}.${body.code}`, "api.unauthorized");
});

// Each crash policy, applied to a turn that fails (faulty's "error").
test("crash policy sleep: a failed turn puts the actor to sleep", async () => {
  const { actor } = await client.actorsCreate({ namespace, name: "faulty", runnerNameSelector: "default", crashPolicy: "sleep" });
  await signal("faulty", actor.actorId, "error");
  const slept = await waitFor("sleep_ts", async () => {
    const a = await byId(actor.actorId);
    return a.sleepTs ? a : null;
  });
  assert.equal(slept.crashPolicy, "sleep");
  assert.equal(slept.connectableTs ?? null, null);
  assert.equal(slept.destroyTs ?? null, null);
  assert.equal(typeof slept.error?.crashed?.message, "string", JSON.stringify(slept.error));
  // The next signal wakes it: the failed event is retried first (with
  // max_attempts 2 it is dead-lettered), then the message runs.
  const ev = await signal("faulty", actor.actorId, "hello");
  await waitFor("the message after the wake", async () =>
    (await v1("GET", `/v1/agents/faulty/sessions/${actor.actorId}/events/${ev}`)).status === "done");
  const woken = await byId(actor.actorId);
  assert.equal(woken.sleepTs ?? null, null);
  assert.equal(woken.connectableTs, woken.createTs);
});

test("crash policy destroy: a failed turn destroys the actor", async () => {
  const { actor } = await client.actorsCreate({ namespace, name: "faulty", runnerNameSelector: "default", crashPolicy: "destroy" });
  await signal("faulty", actor.actorId, "error");
  const gone = await waitFor("destroy_ts", async () => {
    const a = await byId(actor.actorId);
    return a.destroyTs ? a : null;
  });
  assert.equal(gone.crashPolicy, "destroy");
  assert.deepEqual((await client.actorsList({ namespace, actorIds: actor.actorId })).actors.map((a) => a.actorId), [actor.actorId]);
});

test("crash policy restart: a failed turn is retried, the actor stays up", async () => {
  const { actor } = await client.actorsCreate({ namespace, name: "faulty", runnerNameSelector: "default", crashPolicy: "restart" });
  const ev = await signal("faulty", actor.actorId, "flaky 2");
  const done = await waitFor("the retried event to commit", async () => {
    const e = await v1("GET", `/v1/agents/faulty/sessions/${actor.actorId}/events/${ev}`);
    return e.status === "done" ? e : null;
  });
  assert.equal(done.attempts, 1, "one failed attempt, then success");
  const a = await byId(actor.actorId);
  assert.equal(a.crashPolicy, "restart");
  assert.equal(a.sleepTs ?? null, null);
  assert.equal(a.destroyTs ?? null, null);
  assert.equal(a.connectableTs, a.createTs);
});

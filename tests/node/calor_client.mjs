// Drives a Calor server from Node.js, loading the service definitions straight from protos/.
//
//   node tests/node/calor_client.mjs <host:port> <channel>
//
// In <channel> (which should be fresh) it creates a notify trigger on store, subscribes to
// NOTIFY events, stores a memory, recalls it, and waits for the trigger's event. On success it
// prints one JSON line summarising what it checked and exits 0; on any failure it prints the
// reason to stderr and exits 1. Uses only @grpc/grpc-js, @grpc/proto-loader and Node built-ins.

import { createRequire } from 'node:module';
import path from 'node:path';
import process from 'node:process';
import { fileURLToPath } from 'node:url';

import * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const require = createRequire(import.meta.url);
const PROTO_DIR = path.resolve(HERE, '..', '..', 'protos');
const PROTO_FILES = ['calor/v1/memory_service.proto', 'calor/v1/trigger_service.proto'];

const TEXT = 'The node client stored this memory.';
const QUERY = 'what did the node client store?';
const EVENT_WAIT_MS = 10_000;
const CALL_DEADLINE_MS = 30_000;

class CheckError extends Error {}

function check(condition, message) {
  if (!condition) throw new CheckError(message);
}

function loadPackage() {
  // google/protobuf/{timestamp,field_mask}.proto are not under protos/: protobufjs (under
  // proto-loader) serves its bundled copies of the well-known types before the include path.
  const definition = protoLoader.loadSync(PROTO_FILES, {
    keepCase: true,
    longs: String,
    enums: String,
    defaults: true,
    oneofs: true,
    includeDirs: [PROTO_DIR],
  });
  return grpc.loadPackageDefinition(definition).calor.v1;
}

function deadline() {
  return new Date(Date.now() + CALL_DEADLINE_MS);
}

function unary(client, method, request) {
  return new Promise((resolve, reject) => {
    client[method](request, { deadline: deadline() }, (error, response) => {
      if (error) {
        reject(new CheckError(`${method} failed: ${describe(error)}`));
      } else {
        resolve(response);
      }
    });
  });
}

function describe(error) {
  if (error && typeof error.code === 'number') {
    const name = Object.keys(grpc.status).find((k) => grpc.status[k] === error.code) ?? error.code;
    return `${name}: ${error.details}`;
  }
  return String(error && error.stack ? error.stack : error);
}

// Resolves with the first event that `matches`; rejects on a stream error, an early end of the
// stream, or after `ms` without one. `seen` collects every event the stream delivered.
function waitForEvent(stream, matches, ms, seen) {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      finish();
      reject(new CheckError(
        `no matching NOTIFY event within ${ms / 1000} s; the stream delivered ` +
          `${seen.length} event(s): ${JSON.stringify(seen)}`,
      ));
    }, ms);
    const onData = (response) => {
      const event = response.event;
      seen.push(event);
      if (event && matches(event)) {
        finish();
        resolve(event);
      }
    };
    const onError = (error) => {
      finish();
      reject(new CheckError(`Subscribe failed: ${describe(error)}`));
    };
    const onEnd = () => {
      finish();
      reject(new CheckError('Subscribe stream ended before the NOTIFY event arrived'));
    };
    function finish() {
      clearTimeout(timer);
      stream.off('data', onData);
      stream.off('error', onError);
      stream.off('end', onEnd);
    }
    stream.on('data', onData);
    stream.on('error', onError);
    stream.on('end', onEnd);
  });
}

async function run(target, channel) {
  const calor = loadPackage();
  check(calor && calor.MemoryService && calor.TriggerService, 'protos lack calor.v1 services');
  const credentials = grpc.credentials.createInsecure();
  const memories = new calor.MemoryService(target, credentials);
  const triggers = new calor.TriggerService(target, credentials);
  let stream = null;
  try {
    // (a) A notify trigger on store, with an id the client chose.
    const triggerId = `node-notify-${channel}`;
    const created = await unary(triggers, 'CreateTrigger', {
      trigger: {
        id: triggerId,
        channel,
        event: 'EVENT_KIND_ON_STORE',
        action: 'ACTION_KIND_NOTIFY',
        config: { message: 'node saw {text}' },
      },
    });
    const trigger = created.trigger;
    check(trigger, 'CreateTrigger answered without a trigger');
    check(trigger.id === triggerId, `CreateTrigger answered id ${JSON.stringify(trigger.id)}`);
    check(trigger.channel === channel, `trigger channel is ${JSON.stringify(trigger.channel)}`);
    check(trigger.event === 'EVENT_KIND_ON_STORE', `trigger event is ${trigger.event}`);
    check(trigger.action === 'ACTION_KIND_NOTIFY', `trigger action is ${trigger.action}`);

    // (b) Subscribe before storing. after_seq 0 replays the log, so the event cannot be missed
    // even if the server registers the subscriber after the store lands.
    stream = triggers.Subscribe({ channels: [channel], kinds: ['EVENT_KIND_NOTIFY'] });
    // waitForEvent reports errors while it waits; this keeps the CANCELLED status that
    // stream.cancel() produces at the end (and anything after the wait) from crashing node.
    stream.on('error', () => {});
    const seen = [];
    const expected = `node saw ${TEXT}`;
    const notified = waitForEvent(
      stream,
      (event) => event.kind === 'EVENT_KIND_NOTIFY' && event.trigger_id === triggerId &&
        event.message === expected,
      EVENT_WAIT_MS,
      seen,
    );
    notified.catch(() => {}); // observed below; avoid an unhandled rejection meanwhile

    // (c) Store.
    const stored = await unary(memories, 'Store', {
      channel,
      text: TEXT,
      memory_type: 'MEMORY_TYPE_FACT',
    });
    const memory = stored.memory;
    check(memory, 'Store answered without a memory');
    check(typeof memory.id === 'string' && memory.id.length > 0, 'stored memory has no id');
    check(Math.abs(memory.heat - 1) < 1e-6, `stored memory heat is ${memory.heat}, not 1`);
    check(memory.text === TEXT, `stored text is ${JSON.stringify(memory.text)}`);
    check(memory.channel === channel, `stored channel is ${JSON.stringify(memory.channel)}`);
    check(memory.memory_type === 'MEMORY_TYPE_FACT', `stored type is ${memory.memory_type}`);

    // (d) Recall: the top hit is that memory.
    const recalled = await unary(memories, 'Recall', { channel, query: QUERY, limit: 3 });
    const hits = recalled.hits || [];
    check(hits.length > 0, 'Recall found nothing');
    check(
      hits[0].memory && hits[0].memory.id === memory.id,
      `Recall's top hit is ${JSON.stringify(hits[0].memory && hits[0].memory.id)}, ` +
        `not the stored memory ${memory.id}`,
    );

    // (e) The trigger's NOTIFY event arrives on the subscription.
    const event = await notified;
    check(event.channel === channel, `event channel is ${JSON.stringify(event.channel)}`);
    check(event.memory_id === memory.id, `event memory_id is ${JSON.stringify(event.memory_id)}`);

    return {
      ok: true,
      client: 'node',
      node: process.version,
      grpc_js: require('@grpc/grpc-js/package.json').version,
      proto_loader: require('@grpc/proto-loader/package.json').version,
      channel,
      trigger_id: triggerId,
      memory_id: memory.id,
      heat: memory.heat,
      recall_hits: hits.length,
      top_hit_id: hits[0].memory.id,
      top_hit_score: hits[0].score,
      event_seq: event.seq,
      event_kind: event.kind,
      event_trigger_id: event.trigger_id,
      event_message: event.message,
    };
  } finally {
    if (stream) stream.cancel();
    memories.close();
    triggers.close();
  }
}

async function main() {
  const [target, channel] = process.argv.slice(2);
  if (!target || !channel) {
    process.stderr.write('usage: node calor_client.mjs <host:port> <channel>\n');
    return 1;
  }
  try {
    const summary = await run(target, channel);
    process.stdout.write(`${JSON.stringify(summary)}\n`);
    return 0;
  } catch (error) {
    const reason = error instanceof CheckError ? error.message : describe(error);
    process.stderr.write(`node client failed: ${reason}\n`);
    return 1;
  }
}

process.exitCode = await main();

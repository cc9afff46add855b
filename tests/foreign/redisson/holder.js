// node-redisson, driven line by line by dlock's interop tests (tests/src/redisson.rs).
//
// Usage: node holder.js single|cluster HOST:PORT[,HOST:PORT...] WATCHDOG_MS
//
// Reads commands on stdin, one a line, each run at once (a `lock` that waits
// does not hold up the next command):
//   lock NAME      lock() (waits, watchdog lease)  -> LOCKED NAME <epoch ms when granted>
//   trylock NAME   tryLock(0)                      -> LOCKED NAME <ms> | BUSY NAME
//   unlock NAME    unlock()                        -> UNLOCKED NAME <epoch ms before the call>
//   quit           closes the connections and exits
// Prints READY once connected, SUBSCRIBED <channel> each time node-redisson has
// subscribed to a lock channel to wait (so a test releases only once it listens),
// and FAILED <message> on an error.
'use strict';

const readline = require('node:readline');
const { Redisson } = require('node-redisson');

const [mode, hosts, watchdogMs] = process.argv.slice(2);
const nodes = hosts.split(',').map((hostPort) => {
  const [host, port] = hostPort.split(':');
  return { host, port: Number(port) };
});
const redis = mode === 'cluster' ? { clusters: nodes, options: {} } : { options: nodes[0] };
const redisson = new Redisson({ redis, lockWatchdogTimeout: BigInt(watchdogMs) });

// One lock object per name: node-redisson's holder id is the object's.
const locks = new Map();
const lockOf = (name) => {
  if (!locks.has(name)) locks.set(name, redisson.getLock(name));
  return locks.get(name);
};

const executor = redisson.commandExecutor;
const subscribeOnce = executor.subscribeOnce.bind(executor);
executor.subscribeOnce = async (channel, listener) => {
  await subscribeOnce(channel, listener);
  console.log(`SUBSCRIBED ${channel}`);
};

async function run(command, name) {
  const lock = lockOf(name);
  switch (command) {
    case 'lock':
      await lock.lock();
      console.log(`LOCKED ${name} ${Date.now()}`);
      break;
    case 'trylock':
      console.log((await lock.tryLock(0)) ? `LOCKED ${name} ${Date.now()}` : `BUSY ${name}`);
      break;
    case 'unlock': {
      const before = Date.now();
      await lock.unlock();
      console.log(`UNLOCKED ${name} ${before}`);
      break;
    }
    default:
      throw new Error(`unknown command ${command}`);
  }
}

const input = readline.createInterface({ input: process.stdin });
input.on('line', (line) => {
  const [command, name] = line.trim().split(' ');
  if (command === 'quit') {
    redisson.quit().finally(() => process.exit(0));
    return;
  }
  run(command, name).catch((e) => console.log(`FAILED ${command} ${name}: ${e.message}`));
});
input.on('close', () => process.exit(0));

const ready = redisson.redis.ping();
ready.then(
  () => console.log('READY'),
  (e) => console.log(`FAILED connect: ${e.message}`),
);

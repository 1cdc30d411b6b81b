'use strict';
// Starts the real keyflowd of the build tree on 127.0.0.1:0 and reads its
// ports back from --port-file, like tests/e2e/harness.py.
//   KEYFLOW_BUILD_DIR  the build tree (default: <repo>/build)
const { spawn } = require('child_process');
const fs = require('fs');
const os = require('os');
const path = require('path');

const ROOT = path.resolve(__dirname, '..', '..', '..');
const BUILD = path.resolve(ROOT, process.env.KEYFLOW_BUILD_DIR || 'build');
const KEYFLOWD = path.join(BUILD, 'service', 'main', 'keyflowd');
const HANDLERS = path.join(BUILD, 'handlers');
const WAIT_MS = 30000;
// A new data set opens 9 RocksDB stores (8 partitions and home): about 2 s
// in a release build, over 30 s under AddressSanitizer on a busy machine.
const START_MS = 120000;

function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

// Polls predicate() (sync or async) until it returns a truthy value; throws
// naming `what` after timeoutMs.
async function waitFor(predicate, what, timeoutMs = WAIT_MS) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await predicate();
    if (value) {
      return value;
    }
    if (Date.now() > deadline) {
      throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    }
    await sleep(10);
  }
}

class Keyflowd {
  constructor(args = []) {
    this.dir = fs.mkdtempSync(path.join(os.tmpdir(), 'kf-node-'));
    this.args = ['--plugin-dir', HANDLERS, ...args];
    this.proc = null;
  }

  get target() {
    return `127.0.0.1:${this.grpcPort}`;
  }

  async start() {
    const portFile = path.join(this.dir, 'ports');
    fs.rmSync(portFile, { force: true });
    const log = fs.openSync(path.join(this.dir, 'keyflowd.log'), 'a');
    this.proc = spawn(KEYFLOWD, ['--data', path.join(this.dir, 'db'), '--grpc', '127.0.0.1:0',
      '--http', '127.0.0.1:0', '--port-file', portFile, ...this.args],
    { stdio: ['ignore', log, log] });
    fs.closeSync(log);
    let exited = null;
    this.proc.once('exit', (code) => {
      exited = code;
    });
    await waitFor(() => {
      if (exited !== null) {
        throw new Error(`keyflowd exited with ${exited}:\n${this.log()}`);
      }
      return fs.existsSync(portFile) && fs.readFileSync(portFile, 'utf8').includes('http=');
    }, 'keyflowd to start', START_MS);
    const ports = Object.fromEntries(fs.readFileSync(portFile, 'utf8').trim().split(/\s+/)
      .map((line) => line.split('=')));
    this.grpcPort = Number(ports.grpc);
    return this;
  }

  log() {
    try {
      return fs.readFileSync(path.join(this.dir, 'keyflowd.log'), 'utf8').slice(-8000);
    } catch (e) {
      return '';
    }
  }

  // SIGTERM; resolves with the exit code.
  stop() {
    const proc = this.proc;
    this.proc = null;
    if (!proc || proc.exitCode !== null) {
      return Promise.resolve(proc ? proc.exitCode : null);
    }
    return new Promise((resolve) => {
      const timer = setTimeout(() => proc.kill('SIGKILL'), WAIT_MS);
      proc.once('exit', (code) => {
        clearTimeout(timer);
        resolve(code);
      });
      proc.kill('SIGTERM');
    });
  }

  // SIGTERM, then start again over the same data on the same gRPC port.
  async restartSamePort() {
    const port = this.grpcPort;
    const code = await this.stop();
    if (code !== 0) {
      throw new Error(`keyflowd exited ${code} on SIGTERM`);
    }
    this.args.push('--grpc', `127.0.0.1:${port}`);
    await this.start();
  }

  async cleanup() {
    await this.stop();
    fs.rmSync(this.dir, { recursive: true, force: true });
  }
}

// The running_sum example's descriptor under a new function ID; with
// placement ('single' or 'split') placed so, else without one (single).
function runningSumDescriptor(functionId, placement) {
  const d = JSON.parse(fs.readFileSync(path.join(HANDLERS, 'running_sum.descriptor.json'), 'utf8'));
  d.functionId = functionId || unique('rs');
  d.pipelineStateId = `${d.functionId}.state`;
  if (placement) {
    d.placement = `PLACEMENT_${placement.toUpperCase()}`;
  }
  return d;
}

function unique(prefix) {
  return `${prefix}-${Math.random().toString(16).slice(2, 14)}`;
}

const built = fs.existsSync(KEYFLOWD);

module.exports = { Keyflowd, waitFor, sleep, unique, runningSumDescriptor, built, ROOT, WAIT_MS };

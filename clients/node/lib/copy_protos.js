'use strict';
// `npm pack` / `npm publish` run this (prepack): the package carries a copy of
// api/keyflow/v1/*.proto under proto/ (gitignored), since outside the source
// tree ../../api is not there. lib/protos.js prefers the source tree's.
const fs = require('fs');
const path = require('path');

const pkg = path.dirname(__dirname);
const src = process.env.KEYFLOW_PROTO_DIR || path.join(pkg, '..', '..', 'api');
const from = path.join(src, 'keyflow', 'v1');
const to = path.join(pkg, 'proto', 'keyflow', 'v1');
fs.rmSync(path.join(pkg, 'proto'), { recursive: true, force: true });
fs.mkdirSync(to, { recursive: true });
for (const f of fs.readdirSync(from).filter((name) => name.endsWith('.proto'))) {
  fs.copyFileSync(path.join(from, f), path.join(to, f));
}
console.log(`copied protos from ${from} to ${to}`);

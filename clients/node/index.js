'use strict';
// keyflow for Node: a client and a run worker for keyflowd (README.md).
const { Client, KeyflowError, Producer, OutputTail, debounce, batch } = require('./lib/client');
const { Worker, RunContext } = require('./lib/worker');

module.exports = { Client, KeyflowError, Producer, OutputTail, Worker, RunContext, debounce, batch };

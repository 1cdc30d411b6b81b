'use strict';
// keyflow for Node: a client, a run worker and remote process-function
// handlers for keyflowd (README.md).
const {
  Client, KeyflowError, Producer, OutputTail, debounce, batch, retry,
} = require('./lib/client');
const { Worker, RunContext, RetryableError } = require('./lib/worker');
const {
  FunctionWorker, Activation, HandlerError, implementationDigest, remoteDescriptor, withPlacement,
} = require('./lib/handler');

module.exports = {
  Client, KeyflowError, Producer, OutputTail, Worker, RunContext, RetryableError, debounce, batch,
  retry, FunctionWorker, Activation, HandlerError, implementationDigest, remoteDescriptor,
  withPlacement,
};

// Checks keyflowd's OpenAPI document with independent validators, for
// tests/e2e/test_openapi.py:
//
//   node openapi_check.js DOCUMENT.json [SAMPLES.json]
//
// DOCUMENT is validated against the OpenAPI 3.1 JSON Schema by npm's
// @seriousme/openapi-schema-validator, and every $ref must resolve. Each
// sample ({"path", "method", "status", "body"}: a real answer of the server)
// is then validated with ajv (JSON Schema 2020-12, OpenAPI 3.1's dialect)
// against the response schema the document gives for that operation and
// status. A sample may also carry the request that was sent
// ({"request": {"path": {name: text}, "query": {name: [text, ...]},
// "body": JSON}}): each parameter is validated against its documented
// schema (as text, the way OpenAPI serializes it: types are coerced) and
// unknown parameters are errors, and the body against the requestBody
// schema. Prints {"valid": bool, "errors": [...], "checked": N,
// "requestsChecked": M} and exits 0 only when everything is valid.
'use strict';

const fs = require('fs');
const Ajv2020 = require('ajv/dist/2020').default;

function responseSchema(doc, path, method, status) {
  const op = doc.paths[path] && doc.paths[path][method];
  if (!op) return { error: `no operation ${method.toUpperCase()} ${path}` };
  const key = String(status);
  let response = op.responses[key] || op.responses[`${key[0]}XX`] || op.responses.default;
  if (!response) return { error: `${method.toUpperCase()} ${path}: status ${status} is not documented` };
  if (response.$ref) response = doc.components.responses[response.$ref.split('/').pop()];
  const content = response.content || {};
  const media = content['application/json'] || content['text/plain'];
  return media ? { schema: media.schema, json: !!content['application/json'] } : { schema: null };
}

async function main() {
  const [docPath, samplesPath] = process.argv.slice(2);
  const { Validator } = await import('@seriousme/openapi-schema-validator');
  const validator = new Validator();
  const doc = JSON.parse(fs.readFileSync(docPath, 'utf8'));
  const result = await validator.validate(doc);
  const errors = result.valid ? [] : [{ where: 'document', errors: result.errors }];
  if (result.valid) {
    try {
      validator.resolveRefs();
    } catch (e) {
      errors.push({ where: 'document', errors: String(e) });
    }
  }
  let checked = 0;
  let requestsChecked = 0;
  if (samplesPath && errors.length === 0) {
    const ajv = new Ajv2020({ strict: false, allErrors: true });
    // Parameters travel as text: coerced to their schema's type first.
    const ajvText = new Ajv2020({ strict: false, allErrors: true, coerceTypes: 'array' });
    // The document's components, addressable as "#/components/..." by
    // rewriting each $ref against one schema that holds them.
    ajv.addSchema({ $id: 'doc', components: doc.components });
    ajvText.addSchema({ $id: 'doc', components: doc.components });
    const local = (schema) => JSON.parse(JSON.stringify(schema).replace(/"#\/components\//g, '"doc#/components/'));
    const samples = JSON.parse(fs.readFileSync(samplesPath, 'utf8'));
    for (const s of samples) {
      if (s.request) {
        const where = `${s.method.toUpperCase()} ${s.path} request`;
        const op = doc.paths[s.path] && doc.paths[s.path][s.method];
        if (!op) {
          errors.push({ where, errors: 'no such operation' });
          continue;
        }
        requestsChecked++;
        const params = op.parameters || [];
        for (const [into, values] of [['path', s.request.path || {}], ['query', s.request.query || {}]]) {
          for (const [name, value] of Object.entries(values)) {
            const p = params.find((x) => x.in === into && x.name === name);
            if (!p) {
              errors.push({ where, errors: `${into} parameter ${name} is not documented` });
              continue;
            }
            const list = Array.isArray(value) ? value : [value];
            if (list.length > 1 && !(p.schema.type === 'array' || p.explode)) {
              errors.push({ where, errors: `${into} parameter ${name} given ${list.length} times` });
            }
            for (const text of list) {
              const holder = { v: text };
              const validate = ajvText.compile({ type: 'object', properties: { v: local(p.schema) } });
              if (!validate(holder)) {
                errors.push({ where, parameter: name, value: text, errors: validate.errors });
              }
            }
          }
        }
        if (s.request.body !== undefined) {
          const media = op.requestBody && op.requestBody.content['application/json'];
          if (!media) {
            errors.push({ where, errors: 'a body was sent; the operation documents none' });
          } else {
            const validate = ajv.compile(local(media.schema));
            if (!validate(s.request.body)) {
              errors.push({ where, body: s.request.body, errors: validate.errors });
            }
          }
        }
      }
      if (s.status === undefined) continue; // a request only
      const found = responseSchema(doc, s.path, s.method, s.status);
      if (found.error) {
        errors.push({ where: `${s.method} ${s.path}`, errors: found.error });
        continue;
      }
      if (!found.schema || !found.json) continue;
      const schema = JSON.parse(JSON.stringify(found.schema).replace(/"#\/components\//g, '"doc#/components/'));
      const validate = ajv.compile(schema);
      checked++;
      if (!validate(s.body)) {
        errors.push({ where: `${s.method.toUpperCase()} ${s.path} ${s.status}`, body: s.body, errors: validate.errors });
      }
    }
  }
  process.stdout.write(JSON.stringify({ valid: errors.length === 0, errors, checked, requestsChecked }) + '\n');
  process.exit(errors.length === 0 ? 0 : 1);
}

main().catch((e) => {
  process.stderr.write(`openapi_check failed: ${e && e.stack ? e.stack : e}\n`);
  process.exit(2);
});

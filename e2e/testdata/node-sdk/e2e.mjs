// Drives llmlb with the official OpenAI Node SDK; TestNodeSDKEndToEnd
// (ecosystem_test.go) runs it against llmlb in front of emulated vLLM
// servers. LLMLB_BASE_URL is llmlb's /v1 URL, LLMLB_MODEL the model to ask
// for, LLMLB_ADAPTER a LoRA adapter the servers serve, and LLMLB_BACKENDS
// the comma-separated names x-llmlb-backend may carry.
// Every check is an assertion: a failure exits non-zero with its message,
// and the last line printed is a JSON summary the Go test reads.
import assert from "node:assert/strict";
import OpenAI from "openai";

const client = new OpenAI({ baseURL: process.env.LLMLB_BASE_URL, apiKey: "unused", maxRetries: 0 });
const model = process.env.LLMLB_MODEL;
const adapter = process.env.LLMLB_ADAPTER;
const backends = (process.env.LLMLB_BACKENDS ?? "").split(",");
const summary = {};

// Each answer names the backend that served it.
function servedBy(what, response) {
  const name = response.headers.get("x-llmlb-backend");
  assert.ok(backends.includes(name), `${what}: x-llmlb-backend ${name} is not one of ${backends}`);
}

// Models: the merged list of the healthy backends, each model once.
const models = [];
for await (const m of client.models.list()) models.push(m.id);
assert.deepEqual([...models].sort(), [model, adapter].sort(), `models ${JSON.stringify(models)}`);
summary.models = models;

// Chat, not streamed.
const { data: chat, response: chatResponse } = await client.chat.completions.create({
  model, messages: [{ role: "system", content: "Be brief." }, { role: "user", content: "Say something." }], max_tokens: 5,
}).withResponse();
servedBy("chat", chatResponse);
assert.equal(chat.object, "chat.completion");
assert.equal(chat.choices[0].message.role, "assistant");
assert.ok(chat.choices[0].message.content.length > 0, "empty chat content");
assert.equal(chat.usage.completion_tokens, 5);
summary.chat = chat.choices[0].message.content;

// Chat streamed with usage, to a LoRA adapter learned from /v1/models:
// the role chunk, a chunk a token, then the usage chunk with no choices.
const stream = await client.chat.completions.create({
  model: adapter, messages: [{ role: "user", content: "Stream something." }], max_tokens: 6,
  stream: true, stream_options: { include_usage: true },
});
let text = "";
let usage = null;
let chunks = 0;
for await (const chunk of stream) {
  chunks++;
  if (chunk.usage) usage = chunk.usage;
  for (const c of chunk.choices) text += c.delta?.content ?? "";
}
assert.ok(text.length > 0, "empty streamed content");
assert.ok(chunks >= 8, `only ${chunks} chunks`);
assert.ok(usage, "streamed chat without its usage chunk");
assert.equal(usage.completion_tokens, 6);
assert.ok(usage.prompt_tokens > 0, "streamed usage without prompt tokens");
summary.stream = { text, completion_tokens: usage.completion_tokens };

// Chat streamed without usage: none must arrive.
const plain = await client.chat.completions.create({
  model, messages: [{ role: "user", content: "Again." }], max_tokens: 3, stream: true,
});
for await (const chunk of plain) assert.ok(!chunk.usage, "usage reached a client that did not ask for it");

// Completions.
const { data: comp, response: compResponse } = await client.completions.create({ model, prompt: "Once upon a time", max_tokens: 4 }).withResponse();
servedBy("completion", compResponse);
assert.equal(comp.object, "text_completion");
assert.equal(comp.choices.length, 1);
assert.equal(comp.choices[0].text.trim().split(/\s+/).length, 4);
assert.equal(comp.usage.completion_tokens, 4);
assert.ok(comp.usage.prompt_tokens > 0, "completion usage without prompt tokens");
summary.completion = comp.choices[0].text;

// Completions streamed from a prompt of token ids, with usage.
const { data: compStream, response: compStreamResponse } = await client.completions.create({
  model, prompt: [1, 2, 3, 4, 5], max_tokens: 5, stream: true, stream_options: { include_usage: true },
}).withResponse();
servedBy("completion stream", compStreamResponse);
let compText = "";
let compUsage = null;
for await (const chunk of compStream) {
  if (chunk.usage) compUsage = chunk.usage;
  for (const c of chunk.choices) compText += c.text;
}
assert.equal(compText.trim().split(/\s+/).length, 5, `streamed completion ${JSON.stringify(compText)}`);
assert.ok(compUsage, "streamed completion without its usage chunk");
assert.equal(compUsage.prompt_tokens, 5);
assert.equal(compUsage.completion_tokens, 5);

// Responses, stored: a follow-up names the first by its id, through
// llmlb, which sends it to the server storing it (LLMLB_BASE_URL_2, when
// set, is a second llmlb replica the follow-ups go through).
const other = new OpenAI({ baseURL: process.env.LLMLB_BASE_URL_2 ?? process.env.LLMLB_BASE_URL, apiKey: "unused", maxRetries: 0 });
const first = await client.responses.create({ model, input: "Plan a trip.", max_output_tokens: 4 });
assert.equal(first.object, "response");
// vLLM marks a response that stopped at max_output_tokens incomplete.
assert.ok(["completed", "incomplete"].includes(first.status), `status ${first.status}`);
assert.ok(first.output_text.length > 0, "empty response text");
const second = await other.responses.create({ model, input: "Shorter.", previous_response_id: first.id, max_output_tokens: 3 });
assert.equal(second.previous_response_id, first.id);
assert.equal(second.usage.output_tokens, 3);
assert.ok(second.usage.input_tokens > first.usage.input_tokens, "the follow-up's prompt lacks the stored conversation");

// Streamed with previous_response_id: the SDK's typed events, the id of
// response.created the one response.completed carries.
const events = await other.responses.create({ model, input: "Again.", previous_response_id: second.id, max_output_tokens: 4, stream: true });
let created = null, completed = null, deltas = "";
for await (const ev of events) {
  if (ev.type === "response.created") created = ev.response;
  if (ev.type === "response.output_text.delta") deltas += ev.delta;
  if (ev.type === "response.completed") completed = ev.response;
}
assert.ok(created && completed, "stream without response.created or response.completed");
assert.equal(completed.id, created.id);
assert.equal(completed.previous_response_id, second.id);
assert.ok(deltas.length > 0, "no output_text deltas");

// Retrieve and delete by id, through the other replica.
const got = await other.responses.retrieve(completed.id);
assert.equal(got.id, completed.id);
await other.responses.delete(first.id);
await assert.rejects(client.responses.retrieve(first.id), (err) => err instanceof OpenAI.NotFoundError);
summary.responses = { first: first.id, streamed: completed.id, deltas };

// An unknown model is a 404 the SDK raises as NotFoundError, with
// OpenAI's message and type.
await assert.rejects(
  client.chat.completions.create({ model: "no-such-model", messages: [{ role: "user", content: "x" }] }),
  (err) => err instanceof OpenAI.NotFoundError && err.status === 404 && err.message.length > 0 && err.type?.length > 0,
);
summary.not_found = true;

console.log(JSON.stringify(summary));

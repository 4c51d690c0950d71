// Drives llmlb with the official OpenAI Node SDK; TestNodeSDKEndToEnd
// (node_test.go) runs it against llmlb in front of emulated vLLM servers.
// LLMLB_BASE_URL is llmlb's /v1 URL, LLMLB_MODEL the model to ask for.
// Every check is an assertion: a failure exits non-zero with its message,
// and the last line printed is a JSON summary the Go test reads.
import assert from "node:assert/strict";
import OpenAI from "openai";

const client = new OpenAI({ baseURL: process.env.LLMLB_BASE_URL, apiKey: "unused", maxRetries: 0 });
const model = process.env.LLMLB_MODEL;
const summary = {};

// Models: the merged list of the healthy backends.
const models = [];
for await (const m of client.models.list()) models.push(m.id);
assert.ok(models.includes(model), `models ${JSON.stringify(models)} lack ${model}`);
summary.models = models;

// Chat, not streamed.
const chat = await client.chat.completions.create({
  model, messages: [{ role: "user", content: "Say something." }], max_tokens: 5,
});
assert.equal(chat.object, "chat.completion");
assert.ok(chat.choices[0].message.content.length > 0, "empty chat content");
assert.equal(chat.usage.completion_tokens, 5);
summary.chat = chat.choices[0].message.content;

// Chat streamed with usage: the final chunk carries usage and no choices.
const stream = await client.chat.completions.create({
  model, messages: [{ role: "user", content: "Stream something." }], max_tokens: 6,
  stream: true, stream_options: { include_usage: true },
});
let text = "";
let usage = null;
for await (const chunk of stream) {
  if (chunk.usage) usage = chunk.usage;
  for (const c of chunk.choices) text += c.delta?.content ?? "";
}
assert.ok(text.length > 0, "empty streamed content");
assert.ok(usage, "streamed chat without its usage chunk");
assert.equal(usage.completion_tokens, 6);
summary.stream = { text, completion_tokens: usage.completion_tokens };

// Chat streamed without usage: none must arrive.
const plain = await client.chat.completions.create({
  model, messages: [{ role: "user", content: "Again." }], max_tokens: 3, stream: true,
});
for await (const chunk of plain) assert.ok(!chunk.usage, "usage reached a client that did not ask for it");

// Completions.
const comp = await client.completions.create({ model, prompt: "Once upon a time", max_tokens: 4 });
assert.equal(comp.object, "text_completion");
assert.ok(comp.choices[0].text.length > 0, "empty completion");
assert.equal(comp.usage.completion_tokens, 4);
summary.completion = comp.choices[0].text;

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

// An unknown model is a 404 the SDK raises as NotFoundError.
await assert.rejects(
  client.chat.completions.create({ model: "no-such-model", messages: [{ role: "user", content: "x" }] }),
  (err) => err instanceof OpenAI.NotFoundError,
);
summary.not_found = true;

console.log(JSON.stringify(summary));

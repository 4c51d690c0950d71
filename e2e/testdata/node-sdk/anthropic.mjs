// Drives llmlb with the official Anthropic Node SDK; TestAnthropicNodeSDK
// (e2e/ecosystem_test.go) runs it against llmlb in front of emulated vLLM
// servers. LLMLB_URL is llmlb's base URL (the SDK adds /v1/messages),
// LLMLB_KEY the key (the SDK sends it in x-api-key), LLMLB_MODEL the model.
// Every check is an assertion; the last line printed is a JSON summary.
import assert from "node:assert/strict";
import Anthropic from "@anthropic-ai/sdk";

const client = new Anthropic({ baseURL: process.env.LLMLB_URL, apiKey: process.env.LLMLB_KEY, maxRetries: 0 });
const model = process.env.LLMLB_MODEL;
const summary = {};

// A Message, not streamed.
const msg = await client.messages.create({
  model, max_tokens: 5, system: "Be brief.", messages: [{ role: "user", content: "Say something." }],
});
assert.equal(msg.type, "message");
assert.equal(msg.role, "assistant");
assert.ok(msg.content[0].text.length > 0, "empty message text");
assert.equal(msg.usage.output_tokens, 5);
assert.ok(msg.usage.input_tokens > 0);
summary.message = msg.content[0].text;

// Streamed: the SDK's helper gathers Anthropic's events into the message.
const stream = client.messages.stream({
  model, max_tokens: 6, messages: [{ role: "user", content: "Stream something." }],
});
let text = "";
stream.on("text", (t) => { text += t; });
const final = await stream.finalMessage();
assert.equal(final.usage.output_tokens, 6);
assert.equal(final.content[0].text, text);
assert.ok(text.length > 0, "empty streamed text");
summary.stream = { text, output_tokens: final.usage.output_tokens };

// A tool-calling turn resent whole, as an agent harness sends it.
const turn = await client.messages.create({
  model, max_tokens: 4,
  tools: [{ name: "get_weather", description: "Weather by city", input_schema: { type: "object", properties: { city: { type: "string" } } } }],
  messages: [
    { role: "user", content: "Weather in Paris?" },
    { role: "assistant", content: [{ type: "tool_use", id: "toolu_1", name: "get_weather", input: { city: "Paris" } }] },
    { role: "user", content: [{ type: "tool_result", tool_use_id: "toolu_1", content: "Sunny, 21 C" }] },
  ],
});
assert.equal(turn.usage.output_tokens, 4);

// Counting tokens.
const count = await client.messages.countTokens({ model, messages: [{ role: "user", content: "Count me." }] });
assert.ok(count.input_tokens > 0, "no input_tokens counted");
summary.count = count.input_tokens;

// A wrong key: 401, which the SDK raises as AuthenticationError.
const wrong = new Anthropic({ baseURL: process.env.LLMLB_URL, apiKey: "sk-wrong", maxRetries: 0 });
await assert.rejects(
  wrong.messages.create({ model, max_tokens: 2, messages: [{ role: "user", content: "x" }] }),
  (err) => err instanceof Anthropic.AuthenticationError,
);
summary.unauthorized = true;

console.log(JSON.stringify(summary));

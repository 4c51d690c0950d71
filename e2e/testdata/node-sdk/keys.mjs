// Drives a keyed llmlb with the official OpenAI Node SDK, its key given as
// the SDK's users give it; TestOpenAISDKWithKeys (keys_test.go) runs it.
// LLMLB_BASE_URL is llmlb's /v1 URL, LLMLB_MODEL the key's one model,
// LLMLB_KEY the key (2 requests a minute), LLMLB_WRONG_KEY another.
// Every check is an assertion; the last line is a JSON summary.
import assert from "node:assert/strict";
import OpenAI from "openai";

const base = process.env.LLMLB_BASE_URL;
const model = process.env.LLMLB_MODEL;
const params = { model, prompt: "hi", max_tokens: 2 };
const summary = {};

// A wrong key: OpenAI's 401, invalid_api_key.
const wrong = new OpenAI({ baseURL: base, apiKey: process.env.LLMLB_WRONG_KEY, maxRetries: 0 });
await assert.rejects(wrong.completions.create(params),
  (err) => err instanceof OpenAI.AuthenticationError && err.status === 401 && err.code === "invalid_api_key");
summary.unauthorized = true;

// The key's model list is its one model.
const good = new OpenAI({ baseURL: base, apiKey: process.env.LLMLB_KEY, maxRetries: 0 });
const models = [];
for await (const m of good.models.list()) models.push(m.id);
assert.deepEqual(models, [model]);
summary.models = models;

// Two requests a minute: the first says one remains, the third is a 429
// rate_limit_exceeded whose Retry-After is the 30 s until one comes back.
const { response: first } = await good.completions.create(params).withResponse();
assert.equal(first.headers.get("x-ratelimit-remaining-requests"), "1");
await good.completions.create(params);
await assert.rejects(good.completions.create(params), (err) => {
  assert.ok(err instanceof OpenAI.RateLimitError, `${err}`);
  assert.equal(err.status, 429);
  assert.equal(err.code, "rate_limit_exceeded");
  assert.equal(err.headers.get("retry-after"), "30");
  const ms = Number(err.headers.get("retry-after-ms"));
  assert.ok(ms >= 25000 && ms <= 30000, `retry-after-ms ${ms}`);
  return true;
});
summary.rate_limited = true;

console.log(JSON.stringify(summary));

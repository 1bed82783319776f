// Firefox desktop's (Smart Window) chat call, made with the real OpenAI JS SDK: one JSON
// request per stdin line, one JSON result per stdout line, until stdin closes.
//
// A request: {baseURL, apiKey, defaultHeaders, body, maxRetries?}; `body` is what the
// desktop passes to chat.completions.create (stream and stream_options included).
// A result: {chunks: [...]} for what the SDK yielded (or {completion} when not streamed),
// and `error` {class, status, error, message} when the SDK raised.
import readline from "node:readline";
import OpenAI from "openai";

async function run(request) {
  const client = new OpenAI({
    apiKey: request.apiKey,
    baseURL: request.baseURL,
    defaultHeaders: request.defaultHeaders,
    ...(request.maxRetries === undefined ? {} : { maxRetries: request.maxRetries }),
  });
  const result = { chunks: [] };
  try {
    const answer = await client.chat.completions.create(request.body);
    if (request.body.stream) {
      for await (const chunk of answer) {
        result.chunks.push(chunk);
      }
    } else {
      result.completion = answer;
    }
  } catch (error) {
    result.error = {
      class: error?.constructor?.name ?? typeof error,
      status: error?.status ?? null,
      error: error?.error ?? null,
      message: String(error?.message ?? error),
    };
  }
  return result;
}

const lines = readline.createInterface({ input: process.stdin });
for await (const line of lines) {
  if (!line.trim()) {
    continue;
  }
  const result = await run(JSON.parse(line));
  process.stdout.write(JSON.stringify(result) + "\n");
}

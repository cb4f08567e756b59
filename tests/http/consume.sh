#!/usr/bin/env bash
# Publish, receive, acknowledge and nack over the HTTP API with nothing but curl and jq: what a
# service in any language does. Needs TXB (the broker's HTTP base URL), TXB_TOKEN (a token that
# may produce and consume on TOPIC; empty on a broker without tokens) and TOPIC (created
# beforehand). Prints one line per step; exits non-zero at the first thing that is not so.
set -euo pipefail

: "${TXB:?set TXB to the HTTP base URL of the broker}"
: "${TOPIC:?set TOPIC to a topic that exists}"
GROUP="${GROUP:-shell-consumers}"
answer=$(mktemp)
trap 'rm -f "$answer"' EXIT
auth=()
if [ -n "${TXB_TOKEN:-}" ]; then auth=(-H "Authorization: Bearer $TXB_TOKEN"); fi

# POST a JSON body; fail unless the answer has the expected status; print the answer's body.
post() {
  local path=$1 body=$2 want=$3 status
  status=$(curl -sS -X POST "$TXB$path" "${auth[@]}" -H 'Content-Type: application/json' \
    -d "$body" -o "$answer" -w '%{http_code}')
  if [ "$status" != "$want" ]; then
    echo "POST $path answered $status, not $want: $(cat "$answer")" >&2
    exit 1
  fi
  cat "$answer"
}

fail() { echo "$*" >&2; exit 1; }

receive() {  # max wait_ms invisible_ms
  post "/v1/groups/$GROUP/topics/$TOPIC/receive" \
    "$(jq -nc --argjson m "$1" --argjson w "$2" --argjson i "$3" \
      '{max: $m, wait_ms: $w, invisible_ms: $i}')" 200
}

# 1. Publish three messages, one of them binary.
for n in 1 2 3; do
  post "/v1/topics/$TOPIC/messages" \
    "$(jq -nc --arg n "$n" '{body: ("order " + $n), key: ("order-" + $n)}')" 201 >/dev/null
done
post "/v1/topics/$TOPIC/messages" '{"body": "AAEC/w==", "encoding": "base64"}' 201 >/dev/null
echo "published 4"

# 2. Receive them all (a long poll answers as soon as there are messages).
got='[]'
for _ in 1 2 3 4 5 6 7 8 9 10; do
  batch=$(receive 10 1000 30000)
  got=$(jq -c --argjson a "$got" '$a + .messages' <<<"$batch")
  [ "$(jq length <<<"$got")" -ge 4 ] && break
done
[ "$(jq length <<<"$got")" -eq 4 ] || fail "received $(jq length <<<"$got") messages, not 4"
jq -e 'map(select(.encoding == "base64")) | .[0].body == "AAEC/w=="' <<<"$got" >/dev/null \
  || fail "the binary body did not come back as base64: $got"
jq -e 'all(.delivery_attempt == 1)' <<<"$got" >/dev/null || fail "not first deliveries: $got"
echo "received 4"

# 3. Acknowledge all but "order 2"; acknowledging again is no error.
acks=$(jq -c '{receipts: [.[] | select(.body != "order 2") | .receipt]}' <<<"$got")
applied=$(post "/v1/groups/$GROUP/topics/$TOPIC/ack" "$acks" 200 | jq '.applied | length')
[ "$applied" -eq 3 ] || fail "acknowledged $applied, not 3"
stale=$(post "/v1/groups/$GROUP/topics/$TOPIC/ack" "$acks" 200 | jq '.stale | length')
[ "$stale" -eq 3 ] || fail "a second ack found $stale stale receipts, not 3"
echo "acked 3"

# 4. Nack "order 2": it comes again, one attempt later, under a new receipt.
first=$(jq -c 'map(select(.body == "order 2")) | .[0]' <<<"$got")
post "/v1/groups/$GROUP/topics/$TOPIC/nack" \
  "$(jq -c '{receipts: [.receipt], delay_ms: 0}' <<<"$first")" 200 >/dev/null
echo "nacked 1"
again='null'
for _ in 1 2 3 4 5 6 7 8 9 10; do
  again=$(receive 1 1000 30000 | jq -c '.messages[0]')
  [ "$again" != null ] && break
done
jq -e --argjson f "$first" \
  '.message_id == $f.message_id and .delivery_attempt == 2 and .receipt != $f.receipt' \
  <<<"$again" >/dev/null || fail "the nacked message did not come again: $again"
post "/v1/groups/$GROUP/topics/$TOPIC/ack" "$(jq -c '{receipts: [.receipt]}' <<<"$again")" 200 \
  >/dev/null
echo "redelivered and acked 1"

# 5. Nothing is left.
left=$(receive 10 500 30000 | jq '.messages | length')
[ "$left" -eq 0 ] || fail "$left messages left"
echo "done"

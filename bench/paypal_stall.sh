#!/usr/bin/env bash
# PayPal certificate-fetch stall benchmark (issue 10, item 2). `einmal serve` on a fresh
# temp store with its certificate fetches sent to a local blackhole (accepts TCP, never
# answers: EINMAL_PAYPAL_CERT_ADDR). 50 client threads send PayPal requests with fresh
# certificate URLs (each one would be a new fetch): a wave of 50 concurrent ones every
# second, or with ATTACK=flood back to back, while one client measures signed Stripe
# requests and GET /healthz. Prints latency percentiles of those without and under the
# attack, the attack's answers and how many fetches reached the blackhole.
#   bench/paypal_stall.sh [seconds] [attackers]   PROFILE=debug: the debug build
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-10}
attackers=${2:-50}
profile=${PROFILE:-release}
if [ "$profile" = release ]; then
  cargo build --release --quiet --bin einmal
else
  cargo build --quiet --bin einmal
fi
bin=target/$profile/einmal
work=$(mktemp -d)
cat >"$work/einmal.toml" <<'EOF'
[[tenant]]
provider = "stripe"
tenant = "bench"
secrets = ["whsec_bench_stripe"]

[[tenant]]
provider = "paypal"
tenant = "bench"
secrets = ["unused: PayPal signs with its own key"]
options = { webhook_id = "4JH86294D6297924G" }
EOF
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
port=$(free_port)
hole=$(free_port)
python3 - "$hole" >"$work/blackhole.count" <<'EOF' &
import socket, sys, signal
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(1024)
held = []
def report(*_):
    print(len(held), flush=True); sys.exit(0)
signal.signal(signal.SIGTERM, report)
while True:
    c, _ = s.accept(); held.append(c)
EOF
blackhole=$!
EINMAL_PAYPAL_CERT_ADDR="127.0.0.1:$hole" RUST_LOG=warn \
  "$bin" serve --addr "127.0.0.1:$port" --data-dir "$work/store" --config "$work/einmal.toml" 2>/dev/null &
server=$!
trap 'kill $server $blackhole 2>/dev/null; wait $server $blackhole 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 200); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.1; done
python3 - "$port" "$seconds" "$attackers" "${ATTACK:-wave}" <<'EOF'
import hashlib, hmac, http.client, json, sys, threading, time, uuid
port, seconds, attackers = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
flood = sys.argv[4] == "flood"

def conn():
    return http.client.HTTPConnection("127.0.0.1", port, timeout=60)

def stripe(c, n):
    body = json.dumps({"id": f"evt_bench_{n}_{uuid.uuid4().hex[:8]}", "object": "event",
                       "type": "payment_intent.succeeded", "created": int(time.time()),
                       "data": {"object": {"id": "pi_1", "object": "payment_intent"}}}).encode()
    t = str(int(time.time()))
    mac = hmac.new(b"whsec_bench_stripe", t.encode() + b"." + body, hashlib.sha256).hexdigest()
    c.request("POST", "/webhooks/stripe/bench", body,
              {"Stripe-Signature": f"t={t},v1={mac}", "Content-Type": "application/json"})
    r = c.getresponse(); r.read(); assert r.status == 200, r.status

def healthz(c):
    c.request("GET", "/healthz"); r = c.getresponse(); r.read(); assert r.status == 200

def measure(duration):
    lat = {"stripe": [], "healthz": []}
    c, n, end = conn(), 0, time.time() + duration
    while time.time() < end:
        for kind in ("stripe", "healthz"):
            start = time.perf_counter()
            stripe(c, n) if kind == "stripe" else healthz(c)
            lat[kind].append((time.perf_counter() - start) * 1000)
            n += 1
    return lat

def pct(v, p):
    v = sorted(v); return v[min(len(v) - 1, int(len(v) * p))]

def show(label, lat):
    for kind, v in lat.items():
        print(f"{label:>8} {kind:>8}: n={len(v):5d}  p50={pct(v,.5):7.2f} ms  "
              f"p99={pct(v,.99):7.2f} ms  max={max(v):7.2f} ms")

stop, answers, lock = False, {}, threading.Lock()
def attack():
    c = conn()
    while not stop:
        name = "CERT-%s-%s-%s" % tuple(uuid.uuid4().hex[i:i + 8] for i in (0, 8, 16))
        headers = {"PAYPAL-TRANSMISSION-ID": str(uuid.uuid4()),
                   "PAYPAL-TRANSMISSION-TIME": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                   "PAYPAL-TRANSMISSION-SIG": "c2lnbmF0dXJl",
                   "PAYPAL-CERT-URL": f"https://api.paypal.com/v1/notifications/certs/{name}",
                   "PAYPAL-AUTH-ALGO": "SHA256withRSA", "Content-Type": "application/json"}
        try:
            c.request("POST", "/webhooks/paypal/bench", b'{"id":"WH-1","event_type":"X"}', headers)
            r = c.getresponse(); r.read(); status = r.status
        except Exception as e:
            status = type(e).__name__; c = conn()
        with lock:
            answers[status] = answers.get(status, 0) + 1
        if not flood:
            time.sleep(max(0.0, 1.0 - time.time() % 1.0))

show("baseline", measure(min(seconds, 3)))
threads = [threading.Thread(target=attack) for _ in range(attackers)]
for t in threads: t.start()
time.sleep(0.5)
show("attack", measure(seconds))
stop = True
for t in threads: t.join()
print(f"attack ({'flood' if flood else 'waves'}): {attackers} clients, answers {dict(sorted(answers.items(), key=str))}")
EOF
kill $blackhole; wait $blackhole 2>/dev/null || true
echo "certificate fetches that reached the blackhole: $(cat "$work/blackhole.count")"

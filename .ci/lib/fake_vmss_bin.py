#!/usr/bin/env python3
"""A stand-in for the vmss-capacity-controller binary, used ONLY to test the mechanics of
.ci/prometheus-scrape.sh (process start-up and teardown, Prometheus, queries, promtool) before
the real daemon exists:  .ci/prometheus-scrape.sh .ci/lib/fake_vmss_bin.py
It proves nothing about the daemon. Subcommands: `emulator --listen HOST:0`, `run --config F`.
"""
import json, re, signal, sys, threading, time, urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

def emulator(listen):
    host, port = listen.rsplit(":", 1)
    sets, lock = {}, threading.Lock()
    class H(BaseHTTPRequestHandler):
        def log_message(self, *a): pass
        def reply(self, code, body, headers=()):
            data = json.dumps(body).encode()
            self.send_response(code)
            for k, v in headers: self.send_header(k, v)
            self.send_header("content-type", "application/json"); self.send_header("content-length", str(len(data)))
            self.end_headers(); self.wfile.write(data)
        def body(self):
            n = int(self.headers.get("content-length") or 0)
            return self.rfile.read(n) if n else b""
        def do_POST(self):
            b = self.body()
            if self.path == "/_emulator/scale-sets":
                d = json.loads(b)
                with lock: sets[d["name"]] = {"capacity": d["capacity"], "etag": 1}
                return self.reply(201, {})
            m = re.fullmatch(r"/_emulator/scale-sets/[^/]+/[^/]+/([^/]+)/capacity", self.path)
            if m:
                with lock:
                    s = sets[m.group(1)]; s["capacity"] = json.loads(b)["capacity"]; s["etag"] += 1
                return self.reply(200, {})
            if self.path.endswith("/oauth2/v2.0/token"):
                return self.reply(200, {"access_token": "tok", "expires_in": 3600, "token_type": "Bearer"})
            self.reply(404, {"error": {"code": "NotFound", "message": self.path}})
        def vmss(self):
            m = re.search(r"/virtualMachineScaleSets/([^/?]+)", self.path)
            return m and m.group(1)
        def do_GET(self):
            name = self.vmss()
            with lock:
                if name not in sets: return self.reply(404, {"error": {"code": "NotFound", "message": ""}})
                s = dict(sets[name])
            self.reply(200, {"name": name, "etag": f'"{s["etag"]}"', "sku": {"capacity": s["capacity"]}}, [("ETag", f'"{s["etag"]}"')])
        def do_PUT(self):
            name = self.vmss(); b = json.loads(self.body())
            with lock:
                s = sets[name]
                if self.headers.get("If-Match") not in (None, f'"{s["etag"]}"'):
                    return self.reply(412, {"error": {"code": "PreconditionFailed", "message": ""}})
                s["capacity"] = b["sku"]["capacity"]; s["etag"] += 1; e = s["etag"]
            self.reply(200, {"name": name, "etag": f'"{e}"', "sku": {"capacity": b["sku"]["capacity"]}}, [("ETag", f'"{e}"')])
    srv = ThreadingHTTPServer((host, int(port)), H)
    print(f"emulator listening on http://{host}:{srv.server_address[1]}", flush=True)
    srv.serve_forever()

def run(config):
    text = open(config).read()
    emu = re.search(r"resourceManagerEndpoint: (\S+)", text).group(1)
    listen = re.search(r"metricsListen: (\S+)", text).group(1)
    groups = [(m[0], int(m[1]), int(m[2]), int(m[3])) for m in re.findall(r"name: ([\w-]+), minSize: (\d+), maxSize: (\d+), desiredCapacity: (\d+)", text)]
    path = lambda n: f"{emu}/subscriptions/s/resourceGroups/r/providers/Microsoft.Compute/virtualMachineScaleSets/{n}"
    cache, writes, conflicts, cap, lock = {}, {}, {}, {}, threading.Lock()
    last_ok = [0.0]
    def call(method, url, body=None, etag=None):
        req = urllib.request.Request(url, method=method, data=json.dumps(body).encode() if body else None)
        if etag: req.add_header("If-Match", etag)
        try:
            with urllib.request.urlopen(req, timeout=5) as r: return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e: return e.code, None
    def loop():
        while True:
            for name, lo, hi, want in groups:
                c = cache.get(name)
                if not c or time.time() - c[2] > 2:
                    # The fake keeps the previous ETag with a fresh size, so the rival's writes
                    # produce 412s (the real daemon's conflicts come from real races).
                    st, b = call("GET", path(name)); c = cache[name] = (b["sku"]["capacity"], c[1] if c else b["etag"], time.time())
                with lock: cap[name] = c[0]
                if c[0] != want:
                    st, b = call("PUT", path(name), {"sku": {"capacity": want}}, c[1])
                    res = "ok" if st == 200 else "precondition_failed" if st == 412 else "error"
                    with lock:
                        writes[(name, res)] = writes.get((name, res), 0) + 1
                        if st == 412: conflicts[(name, "retried_ok")] = conflicts.get((name, "retried_ok"), 0) + 1
                    cache.pop(name, None) if st != 200 else cache.__setitem__(name, (want, b["etag"], time.time()))
            last_ok[0] = time.time(); time.sleep(1)
    threading.Thread(target=loop, daemon=True).start()
    class H(BaseHTTPRequestHandler):
        def log_message(self, *a): pass
        def do_GET(self):
            if self.path in ("/healthz", "/readyz"):
                out = b"ok"
            else:
                L = ['# HELP vmss_capacity_build_info Build.', '# TYPE vmss_capacity_build_info gauge', 'vmss_capacity_build_info{version="fake"} 1',
                     '# HELP vmss_capacity_reconcile_total Passes.', '# TYPE vmss_capacity_reconcile_total counter', 'vmss_capacity_reconcile_total{result="ok"} 1',
                     '# HELP vmss_capacity_reconcile_duration_seconds Pass time.', '# TYPE vmss_capacity_reconcile_duration_seconds histogram',
                     'vmss_capacity_reconcile_duration_seconds_bucket{le="+Inf"} 1', 'vmss_capacity_reconcile_duration_seconds_sum 0.1', 'vmss_capacity_reconcile_duration_seconds_count 1',
                     '# HELP vmss_capacity_arm_requests_total ARM calls.', '# TYPE vmss_capacity_arm_requests_total counter', 'vmss_capacity_arm_requests_total{operation="get",code="200"} 1',
                     '# HELP vmss_capacity_arm_request_duration_seconds ARM latency.', '# TYPE vmss_capacity_arm_request_duration_seconds histogram',
                     'vmss_capacity_arm_request_duration_seconds_bucket{operation="get",le="+Inf"} 1', 'vmss_capacity_arm_request_duration_seconds_sum{operation="get"} 0.1', 'vmss_capacity_arm_request_duration_seconds_count{operation="get"} 1',
                     '# HELP vmss_capacity_cache_invalidations_total Invalidations.', '# TYPE vmss_capacity_cache_invalidations_total counter', 'vmss_capacity_cache_invalidations_total{cache="size",reason="412"} 1',
                     '# HELP vmss_capacity_last_successful_reconcile_timestamp_seconds Last ok pass.', '# TYPE vmss_capacity_last_successful_reconcile_timestamp_seconds gauge', f'vmss_capacity_last_successful_reconcile_timestamp_seconds {last_ok[0]}',
                     '# HELP vmss_capacity_capacity_writes_total Writes.', '# TYPE vmss_capacity_capacity_writes_total counter',
                     '# HELP vmss_capacity_etag_conflicts_total Conflicts.', '# TYPE vmss_capacity_etag_conflicts_total counter']
                with lock:
                    L[L.index('# HELP vmss_capacity_etag_conflicts_total Conflicts.'):L.index('# HELP vmss_capacity_etag_conflicts_total Conflicts.')] = [f'vmss_capacity_capacity_writes_total{{scale_set="{n}",result="{r}"}} {v}' for (n, r), v in writes.items()]
                    L += [f'vmss_capacity_etag_conflicts_total{{scale_set="{n}",outcome="{o}"}} {v}' for (n, o), v in conflicts.items()]
                    for metric, idx in (("scale_set_capacity", None), ("scale_set_desired_capacity", 3), ("scale_set_min_size", 1), ("scale_set_max_size", 2), ("cache_age_seconds", -1)):
                        L += [f'# HELP vmss_capacity_{metric} x.', f'# TYPE vmss_capacity_{metric} gauge']
                        for g in groups:
                            val = cap.get(g[0], 0) if idx is None else (0.5 if idx == -1 else g[idx])
                            L.append(f'vmss_capacity_{metric}{{scale_set="{g[0]}"}} {val}')
                out = ("\n".join(L) + "\n").encode()
            self.send_response(200); self.send_header("content-type", "text/plain; version=0.0.4"); self.end_headers(); self.wfile.write(out)
    host, port = listen.rsplit(":", 1)
    srv = ThreadingHTTPServer((host, int(port)), H)
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
    srv.serve_forever()

if __name__ == "__main__":
    if sys.argv[1] == "emulator": emulator(sys.argv[3])
    elif sys.argv[1] == "run": run(sys.argv[3])
    else: sys.exit(f"fake: unknown subcommand {sys.argv[1:]}")

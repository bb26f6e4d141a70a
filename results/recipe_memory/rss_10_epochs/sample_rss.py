"""Run a command; sample its RSS (process tree) every 0.5 s; timestamp stdout lines. Usage: sample.py OUT -- cmd..."""
import subprocess, sys, time, threading, os
out = sys.argv[1]; cmd = sys.argv[sys.argv.index("--") + 1:]
t0 = time.time()
p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
samples = []
def rss(pid):
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmRSS"): return int(line.split()[1])
    except OSError: return 0
    return 0
def sampler():
    while p.poll() is None:
        samples.append((time.time() - t0, rss(p.pid))); time.sleep(0.5)
th = threading.Thread(target=sampler, daemon=True); th.start()
with open(out, "w") as f:
    for line in p.stdout:
        t = time.time() - t0
        f.write(f"[{t:7.1f}s rss {rss(p.pid)/2**20:5.2f}GiB] {line}"); f.flush()
    p.wait(); th.join()
    peak = max(samples, key=lambda s: s[1]) if samples else (0, 0)
    f.write(f"rc {p.returncode} wall {time.time()-t0:.1f}s peak {peak[1]/2**20:.3f} GiB at {peak[0]:.1f}s\n")
    # coarse timeline
    for t, r in samples[::20]:
        f.write(f"  t={t:7.1f} rss={r/2**20:.2f}GiB\n")

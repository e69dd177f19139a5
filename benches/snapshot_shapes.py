"""The snapshot shapes `benches/snapshot_read.rs` reads, made from a real snapshot's trace:
`snapshot_shapes.py FIXTURE OUT SHAPE ENTRIES`, SHAPE one of shared, unshared, five, ring
(the bench's header says what each is)."""
import os, pickle, random, sys
src, out, shape, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
random.seed(5)
d = pickle.load(open(src, 'rb'))
base = d['device_traces'][0]
span = base[-1]['time_us'] - base[0]['time_us'] + 1
trace, k = [], 0
while len(trace) < n:
    for e in base:
        c = dict(e)  # the frames list stays shared, as PyTorch shares one per traceback
        c['time_us'] = e['time_us'] + k * span
        trace.append(c)
    k += 1
del trace[n:]
if shape == 'unshared':
    for e in trace:
        e['frames'] = [dict(f) for f in e['frames']]
elif shape == 'five':
    pool = [f for e in base for f in e['frames']]
    for i, e in enumerate(trace):
        e['frames'] = [dict(pool[(i * 7 + j) % len(pool)]) for j in range(5)]
elif shape == 'ring':
    trace = [e for e in trace if not (e['action'] == 'alloc' and random.random() < 0.1)]
d['device_traces'][0] = trace
with open(out + '.tmp', 'wb') as f:
    pickle.dump(d, f, protocol=4)
os.replace(out + '.tmp', out)

"""Seconds for one `pickle.load` of FILE, interpreter start excluded, with Python's
collector on or off: `pickle_load.py FILE gc|nogc`."""
import pickle, time, sys, gc
if sys.argv[2] == 'nogc':
    gc.disable()
with open(sys.argv[1], 'rb') as f:
    t = time.perf_counter()
    pickle.load(f)
    print(time.perf_counter() - t)

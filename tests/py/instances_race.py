"""`vramscope_hook._attach.instances_of`, the attach's search of the job's objects, while
another thread builds tuples from generators that let the GIL go between items. A search
that holds what `gc.get_objects()` gives while that thread runs makes the tuple's resize
fail (SystemError). `python` (the way the attach searched before) or `core` (the way it
searches now). Prints JSON: the searches made, the tuples built, the errors, and how many
of each class the last search found."""

import gc
import json
import sys
import threading
import time

from vramscope_hook._attach import instances_of


class Marker:
    pass


class Special(Marker):
    pass


def search_in_python(classes):
    objects = gc.get_objects()
    found = [[o for o in objects if isinstance(o, c)] for c in classes]
    del objects
    return found


def main():
    search = instances_of if sys.argv[1] == "core" else search_in_python
    # A search long enough for the interpreter to hand the GIL over in the middle of it.
    held = [[i] for i in range(1_000_000)]
    markers = [Marker(), Special(), Marker()]
    errors, built, stop = [], [0], threading.Event()

    def builder():
        def items():
            for i in range(50):
                time.sleep(0)  # lets the GIL go, the tuple half built
                yield i

        while not stop.is_set():
            try:
                tuple(items())
            except SystemError as e:
                errors.append(str(e))
                return
            built[0] += 1

    t = threading.Thread(target=builder)
    t.start()
    deadline = time.monotonic() + 6
    found, searches = None, 0
    while time.monotonic() < deadline and not errors:
        found = search((Marker, Special))
        searches += 1
        time.sleep(0.001)
    stop.set()
    t.join()
    counts = [len(f) for f in found] if found is not None else None
    print(json.dumps({"searches": searches, "built": built[0], "errors": errors, "found": counts, "markers": len(markers), "held": len(held)}))


main()

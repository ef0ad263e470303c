#!/usr/bin/env python3
"""Summarizes the stack samples bench/gpu_check writes with GPU_CHECK_PROFILE=path.

  bench/symbolize_stacks.py SAMPLES UNSTRIPPED_BINARY [NAME_IN_MAPS]

SAMPLES holds one sample per line (depth, then return addresses, innermost first; the first two
are the signal handler and the kernel's trampoline), then "maps" and the process's /proc/self/maps.
Addresses in the mapping named like the binary (or NAME_IN_MAPS) are symbolized with addr2line on
UNSTRIPPED_BINARY; others are named by their library. Prints the share of samples per innermost
frame, per function on the stack, and per (library the sample was in, first frame of our own).
"""
import collections
import os
import subprocess
import sys


def main():
    samples_path, binary = sys.argv[1], sys.argv[2]
    mapped_name = sys.argv[3] if len(sys.argv) > 3 else os.path.basename(binary)
    lines = open(samples_path).read().split('\n')
    split = lines.index('maps')
    samples = [line.split()[1:] for line in lines[:split] if line]
    maps = []
    for line in lines[split + 1:]:
        fields = line.split()
        if len(fields) >= 6:
            start, end = [int(x, 16) for x in fields[0].split('-')]
            maps.append((start, end, int(fields[2], 16), fields[5]))

    def where(addr):
        for start, end, offset, name in maps:
            if start <= addr < end:
                return name, addr - start + offset
        return '?', addr

    own = {}
    for sample in samples:
        for x in sample[2:]:
            name, offset = where(int(x, 16))
            if os.path.basename(name) == mapped_name:
                own[x] = offset
    names = {}
    addrs = list(own)
    for k in range(0, len(addrs), 2000):
        chunk = addrs[k:k + 2000]
        out = subprocess.run(['addr2line', '-f', '-C', '-e', binary] +
                             [hex(own[a] - 1) for a in chunk],  # return address -> the call
                             capture_output=True, text=True, check=True).stdout.split('\n')
        for j, a in enumerate(chunk):
            names[a] = out[2 * j][:110]

    def label(x):
        return names[x] if x in names else os.path.basename(where(int(x, 16))[0])

    innermost, anywhere, first_own = (collections.Counter() for _ in range(3))
    for sample in samples:
        frames = [label(x) for x in sample[2:]]
        if not frames:
            continue
        innermost[frames[0]] += 1
        for f in set(frames):
            anywhere[f] += 1
        mine = next((names[x] for x in sample[2:] if x in names), '?')
        first_own[('' if sample[2] in names else frames[0], mine)] += 1
    n = len(samples)
    print(f'{n} samples; innermost frame:')
    for f, c in innermost.most_common(25):
        print(f'  {100 * c / n:5.1f}%  {f}')
    print('on the stack:')
    for f, c in anywhere.most_common(50):
        print(f'  {100 * c / n:5.1f}%  {f}')
    print('in (library), first frame of our own:')
    for (lib, f), c in first_own.most_common(30):
        print(f'  {100 * c / n:5.1f}%  {lib:16s} {f}')


if __name__ == '__main__':
    main()

#!/usr/bin/env python3
# Where ptxas put a kernel's spills, from `cuobjdump -sass` output: each register-
# budget region (from one setmaxnreg to the next) with its wgmma, copy and spill
# instruction counts, then every local load and store with the instructions around it.
#   python3 bench/cuda/sass_spills.py FILE.sass NAME_PART [CONTEXT_LINES]
import re
import sys

SPILL = re.compile(r'(@!?U?P\d+\s+)?(STL|LDL)\b')


def instructions(function_text):
    found = []
    for line in function_text.split('\n'):
        match = re.match(r'\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;', line)
        if match:
            found.append((int(match.group(1), 16), match.group(2)))
    return found


def main():
    text = open(sys.argv[1]).read()
    part = sys.argv[2]
    context = int(sys.argv[3]) if len(sys.argv) > 3 else 4
    for function in re.split(r'\n\s*Function : ', text):
        name = function.split('\n', 1)[0]
        if part not in name:
            continue
        print('=====', name)
        code = instructions(function)
        starts = [i for i, (_, t) in enumerate(code) if 'SETMAXREG' in t or 'SETMAXNREG' in t]
        for k, first in enumerate(starts):
            end = starts[k + 1] if k + 1 < len(starts) else len(code)
            region = [t for _, t in code[first:end]]
            print(f'region from {code[first][0]:#x} ({code[first][1]}): {sum("HGMMA" in t for t in region)} wgmma, '
                  f'{sum("LDGSTS" in t for t in region)} cp.async, {sum(bool(SPILL.match(t)) for t in region)} spill')
        for i, (address, text_) in enumerate(code):
            if SPILL.match(text_):
                print(f'--- {address:#x} {text_}')
                for around, instruction in code[max(0, i - context):i + context + 1]:
                    print(f'      {around:#x} {instruction[:100]}')


if __name__ == '__main__':
    main()

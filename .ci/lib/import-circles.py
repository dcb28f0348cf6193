#!/usr/bin/env python3
"""Import circles in src/: files that reach each other by `crate::` and `super::` paths (tests
left out). A circle inside one top-level folder is that room's business; a circle that crosses
folders breaks the floors of docs/architecture.md and fails this check (exit 1).

Approximate by design: it reads paths, not the compiler's resolution (a name re-exported by a
parent counts as an import of the parent). Run from the repository's root.
"""
import os,re,sys
root='src'
files={}
for d,_,fs in os.walk(root):
    for f in fs:
        if f.endswith('.rs'):
            p=os.path.join(d,f)
            mod=p[len(root)+1:-3].replace('/','::')
            if mod.endswith('::mod'): mod=mod[:-5]
            if mod in('lib','main'): mod=''
            files[mod]=p
def strip_tests(s):
    i=s.find('#[cfg(test)]')
    return s if i<0 else s[:i]
def resolve(path):
    parts=path.split('::')
    while parts:
        m='::'.join(parts)
        if m in files: return m
        parts=parts[:-1]
    return None
edges={m:set() for m in files}
for m,p in files.items():
    s=strip_tests(open(p).read())
    s=re.sub(r'//[^\n]*','',s)
    for mm in re.finditer(r'crate::([a-z_][a-z0-9_]*(?:::[a-z_][a-z0-9_]*)*)(?:::\{([^}]*)\})?',s):
        base=mm.group(1); group=mm.group(2)
        targets=[base]
        if group:
            for it in group.split(','):
                it=it.strip().split(' as ')[0].strip()
                if it and it!='self': targets.append(base+'::'+it.split('::')[0])
        for t in targets:
            r=resolve(t)
            if r is not None and r!=m: edges[m].add(r)
    # a child module named by a relative path (`use matching::X`, `matching::f()`)
    for child in re.findall(r'^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+([a-z_][a-z0-9_]*)\s*;', s, re.M):
        cm=(m+'::'+child) if m else child
        if cm in files and re.search(r'(?<![A-Za-z0-9_:])'+child+r'::', s):
            edges[m].add(cm)
    # super:: paths
    for mm in re.finditer(r'\bsuper::([a-z_][a-z0-9_]*)',s):
        parent=m.rsplit('::',1)[0] if '::' in m else ''
        if p.endswith('mod.rs'): parent=m.rsplit('::',1)[0] if '::' in m else ''
        t=(parent+'::'+mm.group(1)) if parent else mm.group(1)
        r=resolve(t) or (parent if parent in files else None)
        if r is not None and r!=m: edges[m].add(r)
# Tarjan
sys.setrecursionlimit(10000)
idx={};low={};st=[];on=set();sccs=[];c=[0]
def sc(v):
    idx[v]=low[v]=c[0];c[0]+=1;st.append(v);on.add(v)
    for w in edges[v]:
        if w not in idx: sc(w);low[v]=min(low[v],low[w])
        elif w in on: low[v]=min(low[v],idx[w])
    if low[v]==idx[v]:
        comp=[]
        while True:
            w=st.pop();on.discard(w);comp.append(w)
            if w==v:break
        sccs.append(comp)
for v in files:
    if v not in idx: sc(v)
top=lambda m: m.split('::')[0] if m else 'lib'
crossing=0
for comp in sccs:
    if len(comp)>1:
        folders=sorted(set(top(m) for m in comp))
        if len(folders)>1:
            crossing+=1
            print(f'FAIL: a circle of {len(comp)} files crosses folders {folders}: {sorted(comp)}')
        else:
            print(f'ok: a circle of {len(comp)} files inside {folders[0]}: {sorted(comp)}')
if crossing:
    sys.exit(1)
print('no import circle crosses a folder of src/')

#!/usr/bin/env python3
# `python3 tools/import-cycles.py src`: the file-level import graph of src/ (use crate::…, use super::…, crate::x::y paths in code); prints
# strongly connected components with more than one file (import cycles). Crude but conservative.
import os,re,sys
root=sys.argv[1] if len(sys.argv)>1 else 'src'
files={}
for dp,_,fs in os.walk(root):
    for f in fs:
        if f.endswith('.rs'):
            p=os.path.join(dp,f); rel=os.path.relpath(p,root)[:-3].split(os.sep)
            if rel[-1] in('mod','lib','main'): rel=rel[:-1]
            files[tuple(rel)]=p
def resolve(mod):
    # longest prefix of mod that is a file
    for n in range(len(mod),-1,-1):
        if tuple(mod[:n]) in files: return tuple(mod[:n])
    return None
edges={k:set() for k in files}
for mod,p in files.items():
    src=open(p).read()
    # strip test modules crudely: cut at '#[cfg(test)]\nmod tests {'
    i=src.find('#[cfg(test)]\nmod tests {')
    if i>=0: src=src[:i]
    if os.path.basename(p)=='tests.rs': continue
    src=re.sub(r'//[^\n]*','',src)
    src=re.sub(r'"(?:[^"\\]|\\.)*"','""',src)
    is_dirmod=os.path.basename(p) in('mod.rs','lib.rs','main.rs')
    for m in re.finditer(r'\b(crate|super)((?:::\w+)+)',src):
        parts=m.group(2).strip(':').split('::')
        if m.group(1)=='crate': base=[]
        else:
            base=list(mod) if is_dirmod else list(mod[:-1])
            base=base[:-1] if is_dirmod else base
            # super from a dir module = parent dir; from a file = its dir's module
            base=list(mod[:-1])
            while parts and parts[0]=='super': parts=parts[1:]; base=base[:-1]
        t=resolve(base+parts)
        if t is not None and t!=mod and t not in ((),):
            # a parent module reached only as a path prefix is not an import of it
            edges[mod].add(t)
# Tarjan
idx={};low={};st=[];on=set();out=[];c=[0]
sys.setrecursionlimit(10000)
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
        if len(comp)>1: out.append(comp)
for v in edges:
    if v not in idx: sc(v)
for comp in out: print(len(comp),' '.join(sorted('/'.join(x) for x in comp)))
print(len(out),'cycles')

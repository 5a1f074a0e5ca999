#!/usr/bin/env python3
# Functions longer than N lines, longest first: `python3 tools/fn-lengths.py 150 src/net`.
# Crude: a function's body is found by matching braces from its `fn` line.
import re,sys,os
N=int(sys.argv[1]); roots=sys.argv[2:]
out=[]
for root in roots:
  for dp,_,fs in os.walk(root):
    for f in fs:
      if not f.endswith('.rs'): continue
      p=os.path.join(dp,f); lines=open(p).read().split('\n')
      i=0
      while i<len(lines):
        m=re.match(r'\s*(pub(\([^)]*\))?\s+)?(async\s+)?fn\s+(\w+)',lines[i])
        if m:
          depth=0; started=False; j=i
          while j<len(lines):
            for ch in lines[j]:
              if ch=='{': depth+=1; started=True
              elif ch=='}': depth-=1
            if started and depth==0: break
            if not started and lines[j].rstrip().endswith(';'): break
            j+=1
          n=j-i+1
          if n>N: out.append((n,p,m.group(4)))
          i=j+1 if started else i+1
        else: i+=1
for n,p,name in sorted(out,reverse=True): print(n,p,name)

#!/usr/bin/env python3
# Reads scripts/ncu-sass.sh output (NAME-sass.csv.gz): warp-state samples and executed
# instructions by opcode and the most-stalled SASS instructions. Usage: sass_profile.py FILE
import csv, gzip, sys, re
f=sys.argv[1]
rows=list(csv.reader(gzip.open(f,'rt')))
hdr=rows[1]; idx={h:i for i,h in enumerate(hdr)}
data=rows[2:]
stalls=[h for h in hdr if h.startswith('stall_') and 'Not Issued' not in h]
tot_inst=sum(int(r[idx['Instructions Executed']] or 0) for r in data)
tot_samp=sum(int(r[idx['Warp Stall Sampling (All Samples)']] or 0) for r in data)
print('total warp instr', tot_inst, 'samples', tot_samp)
# stall totals
st={s:sum(int(r[idx[s]] or 0) for r in data) for s in stalls}
print(sorted(((v,k) for k,v in st.items()),reverse=True)[:10])
# by opcode
by={}
for r in data:
    op=r[idx['Source']].strip()
    op=re.sub(r'^@!?U?P\w+\s+','',op).split()[0] if op else '?'
    op=op.split('.')[0]
    n=int(r[idx['Instructions Executed']] or 0); s=int(r[idx['Warp Stall Sampling (All Samples)']] or 0)
    a=by.setdefault(op,[0,0]); a[0]+=n; a[1]+=s
for op,(n,s) in sorted(by.items(), key=lambda x:-x[1][0])[:25]:
    print(f'{op:12} inst {n:>10} ({100*n/tot_inst:5.1f}%) samples {s:>7} ({100*s/tot_samp:5.1f}%)')
# top sampled instructions
print('top stalled instructions:')
top=sorted(data,key=lambda r:-int(r[idx['Warp Stall Sampling (All Samples)']] or 0))[:25]
for r in top:
    s=int(r[idx['Warp Stall Sampling (All Samples)']]); 
    reasons=sorted(((int(r[idx[k]] or 0),k[6:]) for k in stalls),reverse=True)[:3]
    print(f"{r[idx['Address']][-5:]} {s:6} {r[idx['Instructions Executed']]:>9} {r[idx['Source']].strip()[:60]:60} {reasons}")

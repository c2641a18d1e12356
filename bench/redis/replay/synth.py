# A capture without a test run: N joins (anonymous, or USER=1 with a proven user id of 17
# bytes each, as memory_per_place's MEM_USER=1) in `batch` calls of B joins each, written
# in MONITOR's format for replay.py (the same arguments a node sends: batch.rs `join_args`).
# Deterministic (fixed nonces), so two scripts replay the very same calls.
#   python3 synth.py OUT.txt [N=2000] [B=32]      then MON=OUT.txt python3 replay.py ...
import sys,os,random
out=sys.argv[1]; n=int(sys.argv[2]) if len(sys.argv)>2 else 2000; b=int(sys.argv[3]) if len(sys.argv)>3 else 32
user=os.environ.get('USER_JOINS')=='1'
keys=['m','p','u','q','ws','ad','as','ae','t','to','w','md','l','iv','it','hu','hs','ex','pq','ps','lg','qf','wi']
rnd=random.Random(7)
def q(x):
    if isinstance(x,bytes): return '"'+''.join('\\x%02x'%c for c in x)+'"'
    return '"'+x+'"'
t=1700000000000
with open(out,'w') as f:
    for i in range(0,n,b):
        args=['EVALSHA','0'*40,'23']+[f'wr:{{mem}}:{k}' for k in keys]+['batch',str(t)]
        for j in range(i,min(n,i+b)):
            nonce=bytes(rnd.getrandbits(8) for _ in range(16))
            if user: args+=['join',str(t),'6',nonce,'1',f'user-{j:012}','0','','1']
            else: args+=['join',str(t),'1',nonce]
        f.write('1700000000.000000 [0 127.0.0.1:1] '+' '.join(q(a) for a in args)+'\n')

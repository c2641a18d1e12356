# The Redis store's script exactly as src/store/redis/script.rs builds it (its SHA1 matches
# the EVALSHA a node sends), from a checkout:  python3 script.py CHECKOUT OUT.lua
import re,sys
src=sys.argv[1]
rs=open(src+'/src/store/redis/script.rs').read()
keys=re.findall(r'\("(\w+)", "(K_\w+)"\)', rs)
fx=re.findall(r'\("(FX_\w+)", FxKind', rs)
lm=open(src+'/src/store/redis/log_meta.rs').read()
fields=re.search(r'LOG_FIELDS: \[&str; 25\] = \[(.*?)\];', lm, re.S).group(1)
fields=re.findall(r'"(\w+)"', fields)
maxlen=re.search(r'LOG_MAXLEN: u64 = ([\d_]+);', lm).group(1).replace('_','')
h="-- Generated from src/store/redis/script.rs; not a source file.\n"
for i,(_,n) in enumerate(keys): h+=f"local {n} = KEYS[{i+1}]\n"
for i,n in enumerate(fx): h+=f"local {n} = {i+1}\n"
h+="local RETENTION = 3600000\nlocal WINDOW = 60000\nlocal NEVER = 9007199254740992\n"
for n,v in [("MAX_ITEMS",100000),("DEFAULT_HOLD_TTL_SEC",300),("DEFAULT_MAX_HOLDS_PER_SESSION",10),("DEFAULT_SESSION_EXTEND_SEC",300),("DEFAULT_MAX_EXTENSIONS",0)]:
    h+=f"local {n} = {v}\n"
chunk=re.search(r"pub\(super\) const CHUNK: u64 = (\d+);", rs).group(1)
h+=f"local END_BATCH = 500\nlocal CHUNK = {chunk}\n"
h+="local LOG_FIELDS = {"+", ".join(f"'{f}'" for f in fields)+"}\n"
h+=f"local LOG_MAXLEN = {maxlen}\n"
body=h+''.join(open(f'{src}/src/store/redis/lua/{n}.lua').read() for n in ['rules','holds','schedule','replica','ops'])
open(sys.argv[2],'w').write(body)
import hashlib; print(hashlib.sha1(body.encode()).hexdigest())

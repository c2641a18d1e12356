# The Redis store's script exactly as src/store/redis/script.rs builds it (its SHA1 matches
# the EVALSHA a node sends), from a checkout:  python3 script.py CHECKOUT OUT.lua
# A checkout whose script is also a library of Redis Functions (call.rs) writes that library
# to OUT.lua.fn too (FUNCTION LOAD it; FCALL wr_<SHA1>).
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
fn='begin_call' in rs
if fn:
    names=[n for _,n in keys]
    h+="local KEYS, ARGV\nlocal "+", ".join(names)+"\n"
    h+=("-- Per-call state: each hook registered by on_call runs at the start of every call, in\n"
        "-- the order registered, once the keys and arguments are bound (rules.lua).\n"
        "local ON_CALL = {}\n"
        "local function on_call(f) ON_CALL[#ON_CALL + 1] = f end\n"
        "local function begin_call(keys, argv)\n"
        "  KEYS, ARGV = keys, argv\n"
        "  "+", ".join(names)+" = "+", ".join(f"keys[{i+1}]" for i in range(len(names)))+"\n"
        "  for i = 1, #ON_CALL do ON_CALL[i]() end\n"
        "end\n")
else:
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
import hashlib
if fn:
    lib=body
    body="local EVAL_KEYS, EVAL_ARGV = KEYS, ARGV\n"+body+"return main(EVAL_KEYS, EVAL_ARGV)\n"
    name='wr_'+hashlib.sha1(body.encode()).hexdigest()
    open(sys.argv[2]+'.fn','w').write(f"#!lua name={name}\n"+lib+f"redis.register_function('{name}', main)\n")
open(sys.argv[2],'w').write(body)
print(hashlib.sha1(body.encode()).hexdigest())

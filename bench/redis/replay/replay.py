# Redis instructions per join, noise-free: replays the `batch` script calls captured by
# monitor-redis-server (MONITOR output in MON, default /tmp/redis-cg/monitor.*.txt) against
# a private redis-server under callgrind, with SCRIPT.lua (script.py's output) in place of
# the captured script, into a fresh event (paused, one slot). Counters are zeroed after
# the event is made and dumped after the last call.
# (or written by synth.py: the same calls without a test run). Also prints the commands
# the scripts ran per join (INFO commandstats, read after the dump).
#   python3 replay.py SCRIPT.lua TAG        (prints Ir per join; LAX=1 skips the answer check)
# FN=1: the calls go as FCALL of the library in SCRIPT.lua.fn (script.py writes it for a
# version that has one), loaded with FUNCTION LOAD before the counters are zeroed.
# The Ir list holds one figure per callgrind part: the replayed calls are the larger.
import socket,subprocess,sys,time,glob,re,os,hashlib
mon=os.environ.get('MON') or glob.glob('/tmp/redis-cg/monitor.*.txt')[0]
def unesc(s):
    out=bytearray();i=0
    while i<len(s):
        c=s[i]
        if c=='\\':
            n=s[i+1]
            if n=='x': out.append(int(s[i+2:i+4],16)); i+=4; continue
            out+= {'n':b'\n','r':b'\r','t':b'\t','a':b'\a','b':b'\b','"':b'"','\\':b'\\'}[n]; i+=2; continue
        out+=c.encode(); i+=1
    return bytes(out)
cmds=[]
for line in open(mon, encoding='latin-1'):
    if '"EVALSHA"' not in line or '"batch"' not in line: continue
    args=[unesc(m) for m in re.findall(r'"((?:[^"\\]|\\.)*)"', line[line.index(']')+1:])]
    cmds.append(args)
body=open(sys.argv[1],'rb').read(); tag=sys.argv[2]
OUT=os.environ.get('OUT','/tmp/redis-cg/replay'); os.makedirs(OUT, exist_ok=True)
sha=hashlib.sha1(body).hexdigest()
port=36000+os.getpid()%1000
vp=subprocess.Popen(['valgrind','--tool=callgrind',f'--callgrind-out-file={OUT}/cg.{tag}.%p','/usr/bin/redis-server','--port',str(port),'--save','','--appendonly','no'],stdout=subprocess.DEVNULL,stderr=subprocess.DEVNULL)
def enc(args):
    out=b'*%d\r\n'%len(args)
    for a in args:
        if isinstance(a,str): a=a.encode()
        out+=b'$%d\r\n%s\r\n'%(len(a),a)
    return out
for _ in range(100):
    try: s=socket.create_connection(('127.0.0.1',port)); break
    except OSError: time.sleep(0.2)
f=s.makefile('rb')
def read():
    l=f.readline()
    t=l[:1]
    if t in b'+-:': return l[1:-2]
    if t==b'$':
        n=int(l[1:-2]); 
        if n<0: return None
        d=f.read(n+2); return d[:-2]
    if t==b'*':
        n=int(l[1:-2]); return [read() for _ in range(max(n,0))]
    raise Exception(l)
def call(*a):
    s.sendall(enc(a)); return read()
print(call('SCRIPT','LOAD',body)[:12], file=sys.stderr)
head=('EVALSHA',sha)
if os.environ.get('FN'):
    lib=open(sys.argv[1]+'.fn','rb').read()
    head=('FCALL',call('FUNCTION','LOAD',lib))
    print(head, file=sys.stderr)
keys=cmds[0][3:3+23]
r=call(*head,'23',*keys,'put','1700000000000','0','{}','1','0','120000','300000','3600000','2592000000','0','1','1','0','0','0','','','0','0')
assert r[0]==b'OK', r
call('CONFIG','RESETSTAT')
subprocess.run(['callgrind_control','-z',str(vp.pid)],capture_output=True)
joins=0
for c in cmds:
    c=list(c); c[0]=head[0].encode(); c[1]=head[1] if isinstance(head[1],bytes) else head[1].encode()
    r=call(*c)
    # An answer per operation: {code, ...}, or a fresh join's short answer {seq, ...} or
    # its flat numbers (batch.rs `expand`).
    if not os.environ.get('LAX') and (not isinstance(r,list) or not all((isinstance(x,list) and (x[0]==b'OK' or x[0].isdigit())) or (isinstance(x,bytes) and x.isdigit()) for x in r)): print('bad',str(r)[:300]); break
    i=3+23+2
    while i<len(c):
        joins+=c[i]==b'join'; i+=3+int(c[i+2])
subprocess.run(['callgrind_control','-d',str(vp.pid)],capture_output=True)
time.sleep(1)
# Commands the scripts ran (not the calls themselves), per join.
st=call('INFO','commandstats').decode()
inner={m.group(1):int(m.group(2)) for m in re.finditer(r'cmdstat_(\w+):calls=(\d+)',st) if m.group(1) not in ('evalsha','fcall','function','config','info')}
time.sleep(1)
call('SHUTDOWN','NOSAVE')
vp.wait()
files=sorted(glob.glob(f'{OUT}/cg.{tag}.{vp.pid}*'))
tot=[int(re.search(r'totals: (\d+)',open(x).read()).group(1)) for x in files if 'totals' in open(x).read()]
print(tag, joins, 'joins in', len(cmds),'calls;', 'Ir per join:', [t//max(joins,1) for t in tot])
print(tag, 'commands per join: %.3f' % (sum(inner.values())/max(joins,1)), {k: round(v/max(joins,1),3) for k,v in sorted(inner.items())})

import torch, time, torch.nn.functional as F
torch.set_num_threads(2)
def med(fn, n=30):
    for _ in range(3): fn()
    ts=[]
    for _ in range(n):
        s=time.perf_counter(); fn(); ts.append(time.perf_counter()-s)
    return round(sorted(ts)[n//2]*1e3,3)
def noml(fn):
    def g():
        with torch.backends.mkldnn.flags(enabled=False):
            return fn()
    return g
with torch.inference_mode():
  for shape in [(8960,1536),(1536,8960),(1536,1536),(256,1536),(151936,1536),(4864,896),(896,4864)]:
    W=torch.randn(*shape).bfloat16(); b=torch.randn(shape[0]).bfloat16()
    for rows in (1,2,3):
        x=torch.randn(1, rows, shape[1]).bfloat16()
        res={"F.linear":med(lambda: F.linear(x,W)),
             "F.linear no-mkldnn":med(noml(lambda: F.linear(x,W))),
             "F.linear+bias":med(lambda: F.linear(x,W,b)),
             "F.linear+bias no-mkldnn":med(noml(lambda: F.linear(x,W,b)))}
        if rows==1:
            v=x.view(-1)
            res["mv"]=med(lambda: torch.mv(W,v))
            res["W@x.T"]=med(lambda: (W@x[0].T).T)
        else:
            res["W@x.T"]=med(lambda: (W@x[0].T).T)
        print(shape, rows, res, flush=True)
  # check numerics equal-ish
  W=torch.randn(8960,1536).bfloat16(); x=torch.randn(1,1,1536).bfloat16()
  a=F.linear(x,W)
  with torch.backends.mkldnn.flags(enabled=False): c=F.linear(x,W)
  print("max diff mkldnn vs native", (a.float()-c.float()).abs().max().item(), "exact" if torch.equal(a,c) else "differs")

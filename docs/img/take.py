"""The README's screenshots of the gateway's sign-in pages and the operators' dashboard: run
`warden up --demo`, make a few requests so there is something to show, then
`python3 docs/img/take.py [GATEWAY_URL] [DATA_DIR] [API_URL]` from the repository (needs
Debian's chromium and chromium-driver)."""
import json, subprocess, urllib.request, base64, time, re, tempfile, sys
d = subprocess.Popen(["chromedriver", "--port=9515"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
time.sleep(1)
def call(method, path, body=None):
    req = urllib.request.Request("http://127.0.0.1:9515" + path, method=method,
        data=json.dumps(body).encode() if body is not None else None,
        headers={"content-type": "application/json"})
    return json.load(urllib.request.urlopen(req))["value"]
prof = tempfile.mkdtemp()
s = call("POST", "/session", {"capabilities": {"alwaysMatch": {"browserName": "chrome", "goog:chromeOptions": {"binary": "/usr/bin/chromium", "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync", "--window-size=900,640", "--user-data-dir=" + prof]}}}})["sessionId"]
S = "/session/" + s
G = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:7700"
D = sys.argv[2] if len(sys.argv) > 2 else "warden-data"
A = sys.argv[3] if len(sys.argv) > 3 else "http://127.0.0.1:7701"
users = json.load(open(D + "/demo-users.json"))
pw = next(u["password"] for u in users if u["name"] == "alice")
def shot(name):
    open(name, "wb").write(base64.b64decode(call("GET", S + "/screenshot")))
def el(css):
    return call("POST", S + "/element", {"using": "css selector", "value": css})["element-6066-11e4-a52e-4f735466cecf"]
call("POST", S + "/url", {"url": G + "/apps/demo/"})
shot("docs/img/sign-in.png")
call("POST", S + "/element/" + el("input[name=name]") + "/value", {"text": "alice"})
call("POST", S + "/element/" + el("input[name=password]") + "/value", {"text": pw})
call("POST", S + "/element/" + el("form[action='/login'] button") + "/click", {})
time.sleep(1)
call("POST", S + "/url", {"url": G + "/whoami"})
shot("docs/img/whoami.png")
# The dashboard, signed in with the break-glass admin token (an operator's name and password
# work the same way).
call("POST", S + "/url", {"url": A + "/ui/login"})
call("POST", S + "/element/" + el("input[name=token]") + "/value", {"text": open(D + "/admin-token").read().strip()})
call("POST", S + "/element/" + el("form:has(input[name=token]) button") + "/click", {})
time.sleep(1)
call("POST", S + "/window/rect", {"width": 1100, "height": 760})
for path, name in [("/ui/", "dashboard"), ("/ui/apps/demo", "dashboard-app"), ("/ui/nodes", "dashboard-nodes"), ("/ui/users", "dashboard-users")]:
    call("POST", S + "/url", {"url": A + path})
    time.sleep(1)
    shot("docs/img/%s.png" % name)
call("DELETE", S)
d.kill()

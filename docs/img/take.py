"""The README's screenshots of the gateway's pages: run `warden up --demo`, then
`python3 docs/img/take.py [GATEWAY_URL] [DEMO_USERS_JSON]` from the repository (needs Debian's
chromium and chromium-driver)."""
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
users = json.load(open(sys.argv[2] if len(sys.argv) > 2 else "warden-data/demo-users.json"))
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
call("DELETE", S)
d.kill()

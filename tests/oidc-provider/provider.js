// A real OpenID provider for warden's integration tests: panva's certified oidc-provider,
// on loopback only. Never for production: test-only admin endpoints can rotate its keys and
// tamper with its answers.
//
// node provider.js --users FILE [--port N] [--id-ttl S] [--access-ttl S] [--refresh-ttl S]
// (--refresh-ttl 0: no refresh tokens at all)
// Prints "listening http://127.0.0.1:PORT" once it takes connections.
//
// Users: FILE holds [{"name", "password", "groups": [..]}], read again at every login and every
// refresh, so a test can change a person's groups or remove them.
//
// Test-only endpoints (loopback only, like everything here):
//   POST /admin/client  {"client_id", "client_secret", "redirect_uris": [..]}  registers a client
//   POST /admin/rotate                         a new signing key; the old one is no longer published
//   POST /admin/tamper  {"kind": "aud"|"exp"|"key"}  re-signs the next token answer's ID token
//        with a wrong audience, a past expiry, or a key the provider does not publish

import { createServer } from 'node:http';
import { readFileSync } from 'node:fs';
import { randomUUID } from 'node:crypto';
import { parseArgs } from 'node:util';

import Provider from 'oidc-provider';
import * as jose from 'jose';

const { values: args } = parseArgs({
  options: {
    port: { type: 'string', default: '0' },
    users: { type: 'string' },
    'id-ttl': { type: 'string', default: '300' },
    'access-ttl': { type: 'string', default: '300' },
    'refresh-ttl': { type: 'string', default: '3600' },
  },
});
if (!args.users) {
  console.error('--users FILE is required');
  process.exit(2);
}

function users() {
  return JSON.parse(readFileSync(args.users, 'utf8'));
}

function findUser(name) {
  return users().find((u) => u.name === name);
}

async function newKey() {
  const { privateKey } = await jose.generateKeyPair('RS256', { extractable: true });
  const jwk = await jose.exportJWK(privateKey);
  return { ...jwk, kid: randomUUID(), alg: 'RS256', use: 'sig' };
}

let signingKey = await newKey();
let clients = [];
let tamper = null;
let provider = null;
let issuer = null;

function build() {
  const p = new Provider(issuer, {
    clients,
    jwks: { keys: [signingKey] },
    findAccount: async (ctx, sub) => {
      const u = findUser(sub);
      if (!u) return undefined;
      return {
        accountId: sub,
        // `username`: a preferred_username other than the login (a person may choose theirs).
        claims: async () => ({ sub, preferred_username: u.username || u.name, groups: u.groups || [] }),
      };
    },
    claims: { openid: ['sub'], profile: ['preferred_username'], groups: ['groups'] },
    scopes: ['openid', 'profile', 'groups', 'offline_access'],
    // Scope claims go into the ID token even though an access token is issued too: warden
    // reads the person's groups from the ID token.
    conformIdTokenClaims: false,
    pkce: { methods: ['S256'], required: () => true },
    features: {
      devInteractions: { enabled: false },
      deviceFlow: { enabled: true },
      revocation: { enabled: true },
    },
    // --refresh-ttl 0: no refresh tokens, so a session must end with the tokens' expiry.
    // Every refresh gives a new refresh token and spends the old one (a spent one presented
    // again revokes the grant), as strict providers do: two refreshes of one session at once
    // would end it.
    rotateRefreshToken: () => true,
    issueRefreshToken: async (ctx, client) => Number(args['refresh-ttl']) > 0
      && client.grantTypeAllowed('refresh_token'),
    // Consent is granted for every registered client: they are the test's own.
    loadExistingGrant: async (ctx) => {
      const id = ctx.oidc.result?.consent?.grantId
        || ctx.oidc.session.grantIdFor(ctx.oidc.client.clientId);
      if (id) return ctx.oidc.provider.Grant.find(id);
      const grant = new ctx.oidc.provider.Grant({
        clientId: ctx.oidc.client.clientId,
        accountId: ctx.oidc.session.accountId,
      });
      grant.addOIDCScope('openid profile groups offline_access');
      grant.addOIDCClaims(['preferred_username', 'groups']);
      await grant.save();
      return grant;
    },
    interactions: { url: (ctx, interaction) => `/interaction/${interaction.uid}` },
    ttl: {
      IdToken: Number(args['id-ttl']),
      AccessToken: Number(args['access-ttl']),
      RefreshToken: Number(args['refresh-ttl']) || 1,
      AuthorizationCode: 60,
      Interaction: 600,
      Session: 3600,
      Grant: 3600,
      DeviceCode: 600,
    },
    // Tests run over plain http on loopback.
    cookies: { keys: ['test-only-cookie-key'] },
  });
  p.use(async (ctx, next) => {
    await next();
    if (ctx.path === '/token' && tamper && ctx.body && ctx.body.id_token) {
      const kind = tamper;
      tamper = null;
      ctx.body = { ...ctx.body, id_token: await forge(ctx.body.id_token, kind) };
    }
  });
  return p;
}

// Re-signs `token` as `kind` asks.
async function forge(token, kind) {
  const claims = jose.decodeJwt(token);
  let key = signingKey;
  if (kind === 'aud') claims.aud = 'someone-else';
  if (kind === 'exp') {
    claims.iat = Math.floor(Date.now() / 1000) - 7200;
    claims.exp = Math.floor(Date.now() / 1000) - 3600;
  }
  if (kind === 'key') key = await newKey();
  const priv = await jose.importJWK(key, 'RS256');
  return new jose.SignJWT(claims).setProtectedHeader({ alg: 'RS256', kid: key.kid }).sign(priv);
}

function readBody(req) {
  return new Promise((resolve, reject) => {
    let data = '';
    req.on('data', (c) => {
      data += c;
      if (data.length > 64 * 1024) reject(new Error('body too large'));
    });
    req.on('end', () => resolve(data));
    req.on('error', reject);
  });
}

function send(res, status, type, body) {
  res.writeHead(status, { 'content-type': type });
  res.end(body);
}

function page(uid, message) {
  return `<!doctype html><title>Sign in</title><p>${message}</p>
<form method="post" action="/interaction/${uid}/login">
<input name="login"><input name="password" type="password"><button>Sign in</button></form>`;
}

async function admin(req, res, path) {
  const body = await readBody(req);
  if (path === '/admin/client') {
    const c = JSON.parse(body);
    clients = [{
      client_id: c.client_id,
      client_secret: c.client_secret,
      redirect_uris: c.redirect_uris,
      grant_types: ['authorization_code', 'refresh_token', 'urn:ietf:params:oauth:grant-type:device_code'],
      response_types: ['code'],
      token_endpoint_auth_method: 'client_secret_basic',
    }];
  } else if (path === '/admin/rotate') {
    signingKey = await newKey();
  } else if (path === '/admin/tamper') {
    tamper = JSON.parse(body).kind;
    return send(res, 200, 'application/json', '{}');
  } else {
    return send(res, 404, 'text/plain', 'no such admin endpoint');
  }
  provider = build();
  return send(res, 200, 'application/json', JSON.stringify({ kid: signingKey.kid }));
}

async function interaction(req, res, path) {
  const m = path.match(/^\/interaction\/([^/]+)(\/login)?$/);
  const details = await provider.interactionDetails(req, res);
  if (!m || details.uid !== m[1]) return send(res, 400, 'text/plain', 'unknown interaction');
  if (req.method === 'GET') return send(res, 200, 'text/html', page(details.uid, 'Sign in'));
  const form = new URLSearchParams(await readBody(req));
  const u = findUser(form.get('login') || '');
  if (!u || u.password !== form.get('password')) {
    return send(res, 401, 'text/html', page(details.uid, 'Wrong name or password'));
  }
  return provider.interactionFinished(req, res, { login: { accountId: u.name } }, {
    mergeWithLastSubmission: false,
  });
}

const server = createServer(async (req, res) => {
  try {
    const path = new URL(req.url, issuer).pathname;
    if (req.method === 'POST' && path.startsWith('/admin/')) return await admin(req, res, path);
    if (path.startsWith('/interaction/')) return await interaction(req, res, path);
    return provider.callback()(req, res);
  } catch (e) {
    console.error(e);
    if (!res.headersSent) send(res, 500, 'text/plain', String(e));
  }
});
server.listen(Number(args.port), '127.0.0.1', () => {
  issuer = `http://127.0.0.1:${server.address().port}`;
  provider = build();
  console.log(`listening ${issuer}`);
});

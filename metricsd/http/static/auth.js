// Asking for a bearer token when the server answers 401 or 403, and saying which it was.
//
// A server with tokens (`metricsd cluster up` without --plaintext; README "Security") serves this
// page and its scripts to anyone, but every API call needs a token with the read role. The first
// refusal shows a small form above the charts; the token entered is kept in sessionStorage for
// this tab (data.js) and sent as `Authorization: Bearer ...` on every API call. It never goes into
// a URL: the field has no name, so the form has nothing to submit, and the page's address holds
// only the view.
//
// <body data-auth> says where the page stands, for the style sheet and the browser test:
// "" (no token asked for), "needed" (401, no token sent), "refused" (401, the token sent is
// unknown or expired), "forbidden" (403, the token lacks the role), "held" (a token is sent).

import { AuthError, token } from "./data.js";

const $ = (id) => document.getElementById(id);
const ASKING = ["needed", "refused", "forbidden"];
const WORDS = {
  needed: () => "This server needs a bearer token with the read role (401 unauthorized).",
  refused: (e) => `The token was refused (401 unauthorized): ${e.message}.`,
  forbidden: (e) => `The token was accepted but lacks the role this page needs (403 forbidden): ${e.message}.`,
};

export const isAuthError = (e) => e instanceof AuthError;

// Whether the form is waiting for a token (nothing is worth loading until then).
export const asking = () => ASKING.includes(document.body.dataset.auth);

function show(state, message) {
  document.body.dataset.auth = state;
  $("auth").hidden = !ASKING.includes(state);
  $("content").hidden = ASKING.includes(state);
  $("token-forget").hidden = state !== "held";
  if (message !== undefined) $("auth-message").textContent = message;
}

// After a refusal: forget the token refused, say why, and wait for another.
export function askForToken(e) {
  const state = e.status === 403 ? "forbidden" : e.sent ? "refused" : "needed";
  if (e.sent) token.forget();
  show(state, WORDS[state](e));
  $("token").value = "";
  $("token").focus();
}

// Wires the form and the "forget token" button; `start` loads the page again.
export function wireTokenForm(start) {
  $("auth-form").addEventListener("submit", (ev) => {
    ev.preventDefault(); // never a navigation: the token stays out of every URL
    const value = $("token").value.trim().replace(/^bearer\s+/i, "");
    if (!/^[\x21-\x7e]+$/.test(value)) {
      $("auth-message").textContent = "A token is one line of printable characters, without spaces.";
      return;
    }
    token.set(value);
    $("token").value = "";
    show("held");
    start();
  });
  $("token-forget").addEventListener("click", () => {
    token.forget();
    show("");
    start(); // a server with tokens answers 401, and the form asks again
  });
  if (token.get()) show("held");
}

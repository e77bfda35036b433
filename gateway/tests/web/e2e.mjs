// The web page in headless Chromium (Debian's), driven by playwright-core:
// run by gateway/tests/web.rs against a gateway in front of the real
// services. Each view asserts its visible text (a blank page fails) and is
// screenshotted into $SCREENSHOTS. Any failure exits non-zero.

import { chromium } from "playwright-core";
import { mkdirSync } from "node:fs";

const { BASE_URL, ADMIN_TOKEN, VIEWER_TOKEN, SCREENSHOTS, CHROMIUM = "/usr/bin/chromium" } = process.env;
const TIMEOUT = 30000;
mkdirSync(SCREENSHOTS, { recursive: true });

const browser = await chromium.launch({
  executablePath: CHROMIUM,
  headless: true,
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync"],
});

function check(condition, message) {
  if (!condition) throw new Error(message);
}

async function text(page, selector) {
  await page.locator(selector).first().waitFor({ timeout: TIMEOUT });
  return page.locator(selector).first().innerText();
}

async function waitForText(page, selector, wanted) {
  await page.locator(selector).filter({ hasText: wanted }).first().waitFor({ timeout: TIMEOUT });
}

// What no view may show: a value the page failed to render.
async function readsRight(page, name) {
  const body = await page.locator("body").innerText();
  // Runs of them too ("nullnullnull" has no word boundary inside).
  const bad = body.match(/(?<![A-Za-z])(null|undefined|NaN)+(?![A-Za-z])|\[object [A-Za-z]+\]/);
  check(!bad, `${name}: the page shows "${bad && bad[0]}": ${body.slice(0, 800)}`);
}

async function shot(page, name) {
  await readsRight(page, name);
  const path = `${SCREENSHOTS}/${name}.png`;
  await page.screenshot({ path, fullPage: true });
  console.log(`screenshot ${path}`);
}

async function login(token) {
  const context = await browser.newContext();
  const page = await context.newPage();
  page.on("pageerror", (error) => { console.error(`page error: ${error.message}`); process.exitCode = 1; });
  await page.goto(BASE_URL);
  await page.locator("#token").fill(token);
  await page.locator("#login button").click();
  await page.locator("#nav").waitFor({ state: "visible", timeout: TIMEOUT });
  return page;
}

try {
  // Log in as admin; the login form first.
  const page = await login(ADMIN_TOKEN);
  await waitForText(page, "#who", "admin-user (admin)");

  // JukeBoxes: scan now, followed live until it succeeds.
  await page.locator('tr[data-jukebox="box"] button.scan').click();
  await waitForText(page, 'tr[data-jukebox="box"] .scan-progress', "succeeded");
  check((await text(page, 'tr[data-jukebox="box"]')).includes("1/1 repositories"), "the scan's progress shows its repositories");
  // Times in the browser's time zone, the UTC value on hover.
  await page.reload();
  await page.locator('tr[data-jukebox="box"] time').waitFor({ timeout: TIMEOUT });
  const utc = await page.locator('tr[data-jukebox="box"] time').getAttribute("title");
  check(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z \(UTC\)$/.test(utc || ""), `the change time's UTC value on hover: ${utc}`);
  await shot(page, "1-jukeboxes");

  // Catalog: the upstream #12 package with its service and tenant revisions marked.
  await page.goto(`${BASE_URL}/#/catalog/box`);
  await page.reload();
  const ollama = 'section[data-package="think/ollama"]';
  await waitForText(page, ollama, "0.1.10");
  const shown = await text(page, ollama);
  for (const wanted of ["0.1.10", "service", "head", "0.1.9", "tenant", "newest tenant revision"]) {
    check(shown.includes(wanted), `the catalog shows ${wanted}: ${shown}`);
  }
  // Signatures (#50, the JukeBox's policy is `warn`): a badge with each verdict.
  const badge = async (tag, verdict) => text(page, `${ollama} tr[data-tag="${tag}"] .signature-${verdict}`);
  check((await badge("0.1.9", "verified")) === "verified by release", "0.1.9 verified by the trusted key");
  check((await badge("0.1.10", "unsigned")) === "unsigned", "0.1.10 marked unsigned");
  await page.locator(`${ollama} input`).fill("0.1.8");
  await page.locator(`${ollama} select`).selectOption("tenant");
  await page.locator(`${ollama} button.ask-path`).click();
  await waitForText(page, `${ollama} .upgrade-path`, "0.1.8 → 0.1.9");
  await shot(page, "2-catalog");

  // Purge: a plan with its reasons and totals, executed by typing the target, then the report.
  await page.goto(`${BASE_URL}/#/purge`);
  await page.locator("#make-plan").click();
  await waitForText(page, "#totals", "1 to delete");
  const plan = await text(page, "#plan");
  check(plan.includes("superseded") && plan.includes("installed by tenant apps/ollama"), `the plan's reasons: ${plan}`);
  const planId = (await text(page, "#totals")).match(/\(plan (plan-[0-9a-f]+)\)/)[1];
  await shot(page, "3-purge-plan");
  await page.locator("#execute").click();
  check(await page.locator("#confirm-ok").isDisabled(), "confirm is disabled until the target is typed");
  await page.locator("#confirm-input").fill("jukebox/bo");
  check(await page.locator("#confirm-ok").isDisabled(), "a partial target does not confirm");
  await page.locator("#confirm-input").fill("jukebox/box");
  await page.locator("#confirm-ok").click();
  await waitForText(page, "#report", "executed by admin-user");
  check((await text(page, "#report")).includes("1 deleted"), "the report's totals");
  await shot(page, "4-purge-report");

  // Instances: a blocked instance's explanation.
  await page.goto(`${BASE_URL}/#/instances`);
  // One instance a page (the gateway's --max-page-size 1): "Show more" follows the page token.
  await page.locator("tr[data-instance]").first().waitFor({ timeout: TIMEOUT });
  for (let pages = 1; await page.locator("button.more").isVisible(); pages++) {
    check(pages < 10, "the instance pages never ended");
    const rows = await page.locator("tr[data-instance]").count();
    await page.locator("button.more").click();
    await page.waitForFunction((n) => document.querySelectorAll("tr[data-instance]").length > n, rows, { timeout: TIMEOUT });
  }
  check((await page.locator("tr[data-instance]").count()) === 4, "every instance, each once, over four pages");
  await waitForText(page, 'tr[data-instance="tenant/apps/broken"]', "blocked");
  await page.locator('tr[data-instance="tenant/apps/broken"] button.explain').click();
  await waitForText(page, "#explanation", "Blocked by");
  const explanation = await text(page, "#explanation");
  check(explanation.includes("nothere"), "the explanation names the missing package");
  check(explanation.split("is missing").length === 2, `the blocking reason once: ${explanation}`);
  await shot(page, "5-instances");

  // A viewer sees the plan but no execute button, and a forged call is refused.
  const viewer = await login(VIEWER_TOKEN);
  await viewer.goto(`${BASE_URL}/#/purge/${planId}`);
  await viewer.reload();
  await waitForText(viewer, "#totals", planId);
  check((await viewer.locator("#execute").count()) === 0, "no execute button for a viewer");
  check((await viewer.locator("#make-plan").count()) === 0, "no plan button for a viewer");
  const forged = await viewer.evaluate(async (id) => {
    const csrf = sessionStorage.getItem("vynil-csrf");
    const answer = await fetch(`/api/v1/purge/plans/${id}/execute`, {
      method: "POST", headers: { "content-type": "application/json", "x-csrf-token": csrf },
      body: JSON.stringify({ confirm: "jukebox/box", fingerprint: "x" }),
    });
    return answer.status;
  }, planId);
  check(forged === 403, `a viewer's forged execute is refused (got ${forged})`);
  await shot(viewer, "6-viewer-plan");

  // A failed upgrade (the test publishes 0.1.11 once the purge is done; its
  // Job fails having applied a phase): the explanation shows the quarantine,
  // an operator rolls back, then clears it.
  await page.goto(`${BASE_URL}/#/instances`);
  const quarantine = 'p.quarantine[data-tag="0.1.11"]';
  for (let tries = 0; ; tries++) {
    check(tries < 120, "the quarantine of 0.1.11 never showed");
    await page.locator('tr[data-instance="tenant/apps/ollama"] button.explain').click();
    await page.locator("#explanation h2").waitFor({ timeout: TIMEOUT });
    if ((await page.locator(quarantine).count()) && (await page.locator(`${quarantine} button.rollback`).count())) break;
    await page.waitForTimeout(500);
  }
  const held = await text(page, "#explanation");
  check(held.includes("[E_UPGRADE_FAILED]") && held.includes("awaiting an operator"), `the hold is explained: ${held}`);
  check(held.split("[E_UPGRADE_FAILED]").length === 2, `the code once: ${held}`);
  check(held.split("the 0.1.11 migration failed").length === 2, `the failure once: ${held}`);
  await shot(page, "7-quarantine");
  await page.locator(`${quarantine} button.rollback`).click();
  await waitForText(page, "#explanation", "Rolling back to 0.1.9.");
  await page.locator(`${quarantine} button.clear-quarantine`).click();
  await waitForText(page, "#explanation", "0.1.11 is no longer quarantined.");
  // An upgrade awaiting approval: the page shows the step and approves exactly it.
  await page.goto(`${BASE_URL}/#/instances`);
  for (let tries = 0; ; tries++) {
    check(tries < 120, "the approval of gated's upgrade was never offered");
    await page.locator('tr[data-instance="tenant/apps/gated"] button.explain').click();
    await page.locator("#explanation h2").waitFor({ timeout: TIMEOUT });
    if (await page.locator("#approve-upgrade").count()) break;
    await page.waitForTimeout(500);
  }
  const pending = await text(page, "#explanation");
  check(pending.includes("0.1.9 → 0.1.11") && pending.includes("waits for an operator's approval"), `the pending step: ${pending}`);
  await shot(page, "8-approval");
  await page.locator("#approve-upgrade").click();
  await waitForText(page, "#explanation", "Approved: 0.1.9 → 0.1.11.");
  // A pending upgrade's reason and next time: frozen waits until its freeze ends.
  await page.goto(`${BASE_URL}/#/instances`);
  await page.reload();
  const frozen = 'tr[data-instance="tenant/apps/frozen"]';
  await page.locator("tr[data-instance]").first().waitFor({ timeout: TIMEOUT });
  for (let pages = 1; (await page.locator(frozen).count()) === 0; pages++) {
    check(pages < 10, "frozen never listed");
    const rows = await page.locator("tr[data-instance]").count();
    await page.locator("button.more").click();
    await page.waitForFunction((n) => document.querySelectorAll("tr[data-instance]").length > n, rows, { timeout: TIMEOUT });
  }
  const waits = await text(page, frozen);
  check(waits.includes("waiting") && waits.includes("0.1.9 → 0.1.11") && waits.includes("frozen until 2099-01-01") && waits.includes("audit season"), `the waiting upgrade: ${waits}`);
  // A recall from the catalog page: its reason asked (no move-away), its role shown, then lifted.
  const answer = (dialog) => (dialog.type() === "prompt" ? dialog.accept("leaks memory") : dialog.dismiss());
  page.on("dialog", answer);
  await page.goto(`${BASE_URL}/#/catalog/box`);
  await page.reload();
  const recalled = `${ollama} tr[data-tag="0.1.11"]`;
  await page.locator(`${recalled} button.recall`).click();
  await waitForText(page, recalled, "recalled: leaks memory");
  await shot(page, "9-recall");
  await page.locator(`${recalled} button.lift-recall`).click();
  await page.locator(`${recalled} button.recall`).waitFor({ timeout: TIMEOUT });
  check(!(await text(page, recalled)).includes("recalled:"), "the recall lifted");
  page.off("dialog", answer);
  const viewerInstances = await login(VIEWER_TOKEN);
  await viewerInstances.goto(`${BASE_URL}/#/instances`);
  await viewerInstances.locator("tr[data-instance]").first().waitFor({ timeout: TIMEOUT });
  check((await viewerInstances.locator("button.explain").count()) === 0, "no explain (nor rollback) for a viewer");

  // Logging out ends the session.
  await page.locator("#logout").click();
  await page.locator("#login").waitFor({ timeout: TIMEOUT });
  console.log("web e2e: ok");
} catch (error) {
  console.error(`web e2e failed: ${error.stack || error}`);
  for (const context of browser.contexts()) {
    for (const page of context.pages()) {
      await page.screenshot({ path: `${SCREENSHOTS}/failure-${Date.now()}.png`, fullPage: true }).catch(() => {});
      console.error(`the page at failure (${page.url()}): ${(await page.locator("body").innerText().catch(() => "")).slice(0, 2000)}`);
    }
  }
  process.exitCode = 1;
} finally {
  await browser.close();
}

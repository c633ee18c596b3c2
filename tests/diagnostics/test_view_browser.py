"""End to end: a real one-step ARPO run of the warmed-up tiny model (trajectories saved), the
viewer serving it, and headless Chromium driving the page: open a prompt with a fork, expand the
fork and a tool result, check the task text, a reward and advantage, the branch count against
the JSONL, and that a step written later appears on reload. Saves a screenshot to tmp_path
(docs/images/viewer.png is one of these)."""

from __future__ import annotations

import asyncio
import json
import shutil
import threading
from pathlib import Path

import pytest

CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not (CHROMIUM and CHROMEDRIVER),
        reason="needs chromium and chromedriver on PATH (Debian: apt-get install chromium chromium-driver; "
        ".ci/system installs them)",
    ),
]
SYSTEM_PROMPT = (
    "Solve the task. Compute with <python> code </python>, then answer with <answer> \\boxed{} </answer>."
)


@pytest.fixture(scope="module")
def arpo_run(tmp_path_factory) -> Path:
    """One ARPO step, 2 prompts x 4 trajectories, forking at every tool result."""
    from algorithms.arpo import ARPOConfig, ARPOLearner
    from algorithms.models.tiny import build_tiny_model
    from algorithms.rollout.tree_config import TreeConfig

    out = tmp_path_factory.mktemp("arpo_run")
    cfg = ARPOConfig(
        model=str(build_tiny_model(warmup_steps=150)),
        output_dir=str(out),
        env_kwargs={"system_prompt": SYSTEM_PROMPT},
        total_steps=1,
        prompts_per_step=2,
        group_size=4,
        max_response_tokens=96,
        micro_batch_size=4,
        lr=1e-4,
        threads=1,
        save_trajectories=True,
        eval_every=0,
        progress=False,
        tensorboard=False,
        tree=TreeConfig(initial_rollouts=2, branch_probability=1.0),
    )
    ARPOLearner(cfg).train()
    return out


def read_rows(run: Path) -> dict[int, list[dict]]:
    return {
        int(p.stem.split("_")[1]): [json.loads(line) for line in p.read_text().splitlines()]
        for p in sorted((run / "trajectories").glob("step_*.jsonl"))
    }


def test_saved_advantages_are_the_group_normalised_rewards(arpo_run):
    import torch

    from algorithms.core.advantages import grpo_advantages

    for rows in read_rows(arpo_run).values():
        expected = grpo_advantages(torch.tensor([r["reward"] for r in rows]), [r["group_id"] for r in rows])
        assert [r["advantage"] for r in rows] == pytest.approx(expected.tolist(), abs=1e-5)


def js_number(value: float) -> str:
    """How the page prints a reward (viewer.js `fmt`)."""
    return str(int(value)) if float(value).is_integer() else f"{value:.2f}"


def js_signed(value: float) -> str:
    """How the page prints an advantage (viewer.js `signed`)."""
    return ("+" if value > 0 else "") + f"{value:.2f}"


@pytest.fixture
def viewer_url(arpo_run):
    from baselines.diagnostics.view.server import start

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    runner, url = asyncio.run_coroutine_threadsafe(start(arpo_run, port=0), loop).result(timeout=30)
    yield url
    asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=30)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=30)


@pytest.fixture
def browser():
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is in the dev extra")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,900"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    yield driver
    driver.quit()


def test_browse_a_prompt_expand_a_fork_and_a_tool_result(arpo_run, viewer_url, browser, tmp_path):
    import gymnasium as gym
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    import agent_envs  # noqa: F401  (registers the ids)

    # a prompt whose tree has a fork after a tool result: the run is seeded, so one exists
    steps = read_rows(arpo_run)
    chosen = None
    for step, rows in steps.items():
        for fork in (
            r for r in rows if r["parent_id"] is not None and 0 in r["loss_mask"][: r["branch_offset"]]
        ):
            chosen = step, fork, [r for r in rows if r["group_id"] == fork["group_id"]]
            break
        if chosen:
            break
    assert chosen, "no fork after a tool result in the run: the expand checks below would test nothing"
    step, fork, group = chosen
    question = {t.id: t.question for t in gym.make("AgentMath-v0").unwrapped.tasks}[fork["task_id"]]

    wait = WebDriverWait(browser, 20)
    browser.get(viewer_url)
    button = f'#prompts button[data-step="{step}"][data-group="{fork["group_id"]}"]'
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, button))
    browser.find_element(By.CSS_SELECTOR, button).click()
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "li.node"))

    assert browser.find_element(By.CSS_SELECTOR, "h2.task").text == question
    assert len(browser.find_elements(By.CSS_SELECTOR, "li.node")) == len(group)
    assert browser.find_element(By.ID, "branch-count").text == f"{len(group)} trajectories"
    # the fork hangs under its parent in the tree
    parent_li = browser.find_element(By.CSS_SELECTOR, f'li.node[data-traj="{fork["parent_id"]}"]')
    node = parent_li.find_element(By.CSS_SELECTOR, f'li.node[data-traj="{fork["traj_id"]}"]')
    summary = node.find_element(By.CSS_SELECTOR, ":scope > details > summary")
    assert f"reward {js_number(fork['reward'])}" in summary.text
    assert f"advantage {js_signed(fork['advantage'])}" in summary.text
    assert f"fork of #{fork['parent_id']} at token {fork['branch_offset']}" in summary.text

    summary.click()  # expand the branch: its text, folded prefix and components appear
    # the body is built by the `toggle` event, which the browser fires after the click returns
    body = wait.until(lambda d: node.find_elements(By.CSS_SELECTOR, ":scope > details > .body"))[0]
    assert body.is_displayed() and "correct" in body.find_element(By.CSS_SELECTOR, ".components").text
    shared = body.find_element(By.CSS_SELECTOR, "details.shared")
    shared.find_element(By.TAG_NAME, "summary").click()
    tool = shared.find_element(By.CSS_SELECTOR, "details.tool")
    result = tool.find_element(By.TAG_NAME, "pre")
    assert not result.is_displayed()
    assert " → " in tool.find_element(By.TAG_NAME, "summary").text  # "tool: argument → N lines"
    tool.find_element(By.TAG_NAME, "summary").click()
    assert result.is_displayed() and "<result>" in result.text
    assert body.find_elements(By.CSS_SELECTOR, "span.tok[title^='H = ']"), "no entropy-shaded tokens"
    browser.execute_script("document.getElementById('prompt').scrollTop = 0")
    browser.save_screenshot(str(tmp_path / "viewer.png"))
    assert (tmp_path / "viewer.png").stat().st_size > 10_000

    # a step written while the page is open shows after a reload, with the prompt still open
    later = max(steps) + 1
    shutil.copy(
        arpo_run / "trajectories" / f"step_{step:06d}.jsonl",
        arpo_run / "trajectories" / f"step_{later:06d}.jsonl",
    )
    browser.refresh()
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, f'#prompts button[data-step="{later}"]'))
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "h2.task"))
    assert browser.find_element(By.CSS_SELECTOR, "h2.task").text == question

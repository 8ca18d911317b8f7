from qbench import env


def test_environment_block_has_what_compare_and_readers_need():
    block = env.capture_env(["qbench", "switchback", "--dims", "1024"], config={"dims": [1024]})
    assert block["command"] == "qbench switchback --dims 1024"
    assert block["config"] == {"dims": [1024]}
    for key in ("time_utc", "python", "host", "cpu", "torch", "triton", "gpu_name", "git_commit", "git_dirty"):
        assert key in block, key
    assert block["torch"] and block["python"].count(".") == 2
    assert block["git_commit"] is None or len(block["git_commit"]) == 40

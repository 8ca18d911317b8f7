from qbench import env


def test_environment_block_has_what_compare_and_readers_need():
    block = env.capture_env(["qbench", "switchback", "--dims", "1024"], config={"dims": [1024]})
    assert block["command"] == "qbench switchback --dims 1024"
    assert block["config"] == {"dims": [1024]}
    for key in ("time_utc", "python", "host", "cpu", "torch", "triton", "gpu_name", "git_commit", "git_dirty"):
        assert key in block, key
    assert block["torch"] and block["python"].count(".") == 2
    assert block["git_commit"] is None or len(block["git_commit"]) == 40


def test_command_line_reads_as_qbench_however_it_was_started():
    assert env.command_line(["/x/qbench/__main__.py", "moe", "--world-size", "4"]) == "qbench moe --world-size 4"
    assert env.command_line(["/usr/bin/qbench", "compare", "a b"]) == "qbench compare 'a b'"

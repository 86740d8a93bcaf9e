"""``--device``: where a command runs its model, refused at once and by name where the machine has no such device."""

import pytest
import torch

from longmem.model.device import DeviceError, resolve_device

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks what a machine without CUDA is told")


def test_auto_is_the_gpu_when_there_is_one_else_the_cpu():
    assert resolve_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device("CPU") == "cpu" and resolve_device("") == resolve_device("auto")


@pytest.mark.parametrize("name", ["tpu", "cuda:x", "gpu", "cuda0"])
def test_an_unknown_device_is_refused_with_the_choices(name):
    with pytest.raises(DeviceError, match=f"unknown device '{name}'; use auto, cpu, cuda or cuda:N"):
        resolve_device(name)


@no_cuda
@pytest.mark.parametrize("name", ["cuda", "cuda:1"])
def test_a_gpu_asked_for_where_pytorch_has_no_cuda_is_refused_with_what_to_do(name):
    with pytest.raises(DeviceError, match=rf"--device {name}: this PyTorch .* (CPU-only build|sees no GPU).*"
                                          r"make install-gpu.*--device cpu"):
        resolve_device(name)


@no_cuda
def test_the_cli_and_the_app_refuse_a_missing_gpu_before_loading_anything(capsys, monkeypatch):
    from app.main import main as app_main
    from longmem.cli.main import main as cli_main

    def no_model(*a, **kw):
        raise AssertionError("the model must not be loaded")

    monkeypatch.setattr("longmem.model.longmem.LongMemModel.from_config", no_model)
    assert cli_main(["chat", "--device", "cuda", "--ask", "Who is the narrator?"]) == 2
    assert "error: --device cuda: this PyTorch" in capsys.readouterr().err
    assert app_main(["--device", "cuda:0", "--no-browser"]) == 2
    assert "error: --device cuda:0: this PyTorch" in capsys.readouterr().err

"""The safetensors reader that reads one tensor at a time without mapping the file, against the
safetensors library's own writer."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from launcher.errors import InputError
from launcher.train.models.hf_weights import SafetensorsFile


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.element_size() == 1 else t


def test_each_tensor_reads_back_as_safetensors_wrote_it(tmp_path):
    torch.manual_seed(0)
    tensors = {"w": torch.randn(3, 4), "bf": torch.randn(5).bfloat16(), "half": torch.randn(2, 2).half(),
               "ids": torch.arange(6).reshape(2, 3), "mask": torch.tensor([True, False]), "none": torch.empty(0, 4),
               "f8": torch.randn(4).to(torch.float8_e4m3fn), "scalar": torch.tensor(2.5)}
    path = tmp_path / "m.safetensors"
    save_file(tensors, str(path), metadata={"format": "pt"})
    f = SafetensorsFile(str(path))
    assert set(f.keys()) == set(tensors)  # the metadata entry is not a tensor
    for name, want in tensors.items():
        got = f.get_tensor(name)
        assert (got.dtype, tuple(got.shape)) == (want.dtype, tuple(want.shape)), name
        assert torch.equal(_bits(got), _bits(want)), name
    got = f.get_tensor("w")
    got.add_(1)  # fresh, writable memory: nothing of the file is mapped
    assert torch.equal(f.get_tensor("w"), tensors["w"])


def test_a_truncated_file_names_the_tensor(tmp_path):
    path = tmp_path / "m.safetensors"
    save_file({"a": torch.ones(4), "b": torch.ones(1000)}, str(path))
    data = path.read_bytes()
    path.write_bytes(data[:-100])
    with pytest.raises(InputError, match=r"ends inside b; fix: copy the weights again"):
        SafetensorsFile(str(path)).get_tensor("b")

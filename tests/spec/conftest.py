import pytest
import torch


"""Small models with the shapes of the seeds' examples (no download, CPU-friendly)."""
from __future__ import annotations

import torch
from torch import nn


class AlexNet(nn.Module):
    """The seed's AlexNet layer structure (5 conv, 3 max-pool, 3 dense) with small widths,
    for a 3×227×227 input."""

    def __init__(self, num_classes: int = 10, width: int = 8):
        super().__init__()
        w = width
        self.conv1 = nn.Conv2d(3, w, 11, stride=4)
        self.conv2 = nn.Conv2d(w, 2 * w, 5, padding=2)
        self.conv3 = nn.Conv2d(2 * w, 3 * w, 3, padding=1)
        self.conv4 = nn.Conv2d(3 * w, 3 * w, 3, padding=1)
        self.conv5 = nn.Conv2d(3 * w, 2 * w, 3, padding=1)
        self.relu = nn.ReLU()
        self.max_pool2d = nn.MaxPool2d(kernel_size=3, stride=2)
        self.flatten = nn.Flatten()
        self.fc1 = nn.Linear(2 * w * 6 * 6, 64)
        self.fc2 = nn.Linear(64, 64)
        self.fc3 = nn.Linear(64, num_classes)

    def forward(self, x):
        x = self.conv1(x)
        x = self.relu(x)
        x = self.max_pool2d(x)
        x = self.conv2(x)
        x = self.relu(x)
        x = self.max_pool2d(x)
        x = self.conv3(x)
        x = self.relu(x)
        x = self.conv4(x)
        x = self.relu(x)
        x = self.conv5(x)
        x = self.relu(x)
        x = self.max_pool2d(x)
        x = self.flatten(x)
        x = self.fc1(x)
        x = self.relu(x)
        x = self.fc2(x)
        x = self.relu(x)
        x = self.fc3(x)
        return x


class TinyTransformer(nn.Module):
    """A small transformer encoder classifier."""

    def __init__(self, d_model: int = 32, heads: int = 4, layers: int = 2, classes: int = 4, seq: int = 16):
        super().__init__()
        layer = nn.TransformerEncoderLayer(d_model, heads, dim_feedforward=2 * d_model, dropout=0.0,
                                           batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, classes)

    def forward(self, x):
        return self.head(self.encoder(x).mean(dim=1))

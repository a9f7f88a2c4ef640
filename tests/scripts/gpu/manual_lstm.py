"""pytorch/examples word_language_model's shape: an LSTM language model, batch 20, bptt 35,
parameters updated by hand (no torch.optim), no DataLoader: the corpus is one tensor on
the GPU, sliced per step. Small batch: the GPU waits on kernel launches."""

import argparse
import time

import torch
from _truth import Truth
from torch import nn

p = argparse.ArgumentParser()
p.add_argument("--seconds", type=float, default=50)
p.add_argument("--batch", type=int, default=20)
p.add_argument("--bptt", type=int, default=35)
p.add_argument("--lr", type=float, default=20.0)
p.add_argument("--truth")
a = p.parse_args()
dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
ntokens = 33278


class RNNModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.drop = nn.Dropout(0.2)
        self.encoder = nn.Embedding(ntokens, 200)
        self.rnn = nn.LSTM(200, 200, 2, dropout=0.2)
        self.decoder = nn.Linear(200, ntokens)

    def forward(self, x, hidden):
        out, hidden = self.rnn(self.drop(self.encoder(x)), hidden)
        return self.decoder(self.drop(out)), hidden


corpus = torch.randint(0, ntokens, (2_000_000,))
nbatch = corpus.size(0) // a.batch
data = corpus[: nbatch * a.batch].view(a.batch, -1).t().contiguous().to(dev)
model = RNNModel().to(dev)
crit = nn.NLLLoss()
truth = Truth(a.truth, script="manual_lstm", batch=a.batch, bptt=a.bptt)
hidden = (torch.zeros(2, a.batch, 200, device=dev), torch.zeros(2, a.batch, 200, device=dev))
end = time.time() + a.seconds
i = 0
while time.time() < end:
    for i in range(0, data.size(0) - 1 - a.bptt, a.bptt):
        x, y = data[i:i + a.bptt], data[i + 1:i + 1 + a.bptt].reshape(-1)
        hidden = tuple(h.detach() for h in hidden)
        model.zero_grad()
        out, hidden = model(x, hidden)
        loss = crit(torch.log_softmax(out.view(-1, ntokens), 1), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        for prm in model.parameters():
            prm.data.add_(prm.grad, alpha=-a.lr)
        truth.step()
        if time.time() > end:
            break
truth.end = "exited"

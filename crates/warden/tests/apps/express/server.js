const express = require("express");

const app = express();
app.get("/", (req, res) => {
  res.json({
    answer: process.env.ANSWER || "hello from express",
    label: process.env.WARDEN_LABEL,
    user: req.get("X-Warden-User"),
  });
});
app.listen(Number(process.env.PORT), "127.0.0.1");
